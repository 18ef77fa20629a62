package pki

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWriteRouteCerts: the route certificate verifies against the CA for
// each host, for both ends of a route, and the key is private to its owner.
func TestWriteRouteCerts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, WriteRouteCerts(dir, []string{"127.0.0.1", "localhost"}, time.Hour))
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	require.NoError(t, err)
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	require.NoError(t, err)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			_, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}})
			require.NoError(t, err, "%s usage %v", host, usage)
		}
	}
	_, err = cert.Verify(x509.VerifyOptions{DNSName: "example.com", Roots: pool})
	require.Error(t, err, "not valid for another host")
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	require.Error(t, WriteRouteCerts(t.TempDir(), nil, time.Hour))
}
