package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/shared"
)

// testPKI is a certificate authority and a server certificate for
// 127.0.0.1, made for one test and written as PEM files.
type testPKI struct {
	server    tls.Certificate
	pool      *x509.CertPool
	caFile    string
	otherPool *x509.CertPool // a second, unrelated CA
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		require.NoError(t, err)
		cert, err := x509.ParseCertificate(der)
		require.NoError(t, err)
		return cert, key, der
	}
	ca, caKey, caDER := newCA("broadcast test CA")
	other, _, _ := newCA("someone else's CA")

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano() + 1), Subject: pkix.Name{CommonName: "nats-server"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	server, err := tls.X509KeyPair(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	require.NoError(t, err)

	p := &testPKI{server: server, pool: x509.NewCertPool(), otherPool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem")}
	p.pool.AddCert(ca)
	p.otherPool.AddCert(other)
	require.NoError(t, os.WriteFile(p.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644))
	return p
}

// TestTLSWithLeastPrivilege runs nats.conf with TLS on (a certificate made
// here for 127.0.0.1), connects the services' way (shared.Connect with
// NATS_CA), runs a broadcast through the four services over TLS under their
// users, and checks that a client that does not trust the CA, or does not
// speak TLS, is refused.
func TestTLSWithLeastPrivilege(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	cs, users, op := startSecureServer(t, natstest.ConfigOptions{
		TLS:       &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12},
		ClientTLS: &tls.Config{RootCAs: pki.pool, MinVersion: tls.VersionTLS12},
	})
	require.True(t, strings.HasPrefix(cs.URL, "tls://"), cs.URL)

	// The services' own connection code, as NATS_CA configures it
	// (shared/nats_env_test.go checks the environment mapping).
	cfg := shared.NATSConfig{URL: cs.URL, User: op.User, Password: op.Password, CA: pki.caFile}
	nc, err := shared.Connect(cfg, "tls-test", logtest.Logger())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, shared.WaitConnected(ctx, nc))
	require.True(t, nc.TLSRequired() || strings.HasPrefix(nc.ConnectedUrl(), "tls://"))
	state, err := nc.TLSConnectionState()
	require.NoError(t, err)
	require.Equal(t, "nats-server", state.PeerCertificates[0].Subject.CommonName)
	nc.Close()

	// Refused: an untrusted CA, plain text.
	_, err = cs.DialTLS(op, &tls.Config{RootCAs: pki.otherPool, MinVersion: tls.VersionTLS12})
	require.ErrorContains(t, err, "certificate signed by unknown authority")
	_, err = cs.DialTLS(op, nil)
	require.Error(t, err, "a plain-text client is refused")

	// A broadcast over TLS under the services' users.
	gw := harness.StartGateway(t, gateway.Config{Seed: 2})
	cs.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":500,"burst":20,"concurrency":8}`, gw.URL))
	pcfg := harness.FastRetries()
	pcfg.Users = users
	pipelinetest.StartPipeline(t, cs.Server, pcfg)
	submitAsOperator(t, cs.Server, contract.Task{ID: "tls-1", Channel: "webhook", Template: "x {{.to}}", Recipients: pipelinetest.Recipients("t", 100)})
	p := cs.WaitFinal(t, "tls-1", 30*time.Second)
	t.Logf("over TLS: %s sent=%d; gateway accepted %d", p.State, p.Sent, gw.Ledger().AcceptedKeys())
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 100, p.Sent)
	require.Equal(t, 100, gw.Ledger().AcceptedKeys())
	require.Empty(t, cs.Log.Violations())
}
