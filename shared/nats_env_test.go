package shared

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNATSConfigFromEnv checks the environment mapping, TLS included, and
// that a half-configured client certificate is refused with a clear error.
func TestNATSConfigFromEnv(t *testing.T) {
	t.Setenv("NATS_URL", "tls://127.0.0.1:4222,tls://127.0.0.1:4223")
	t.Setenv("NATS_USER", "ingest")
	t.Setenv("NATS_PASSWORD", "pw")
	t.Setenv("NATS_CREDS", "")
	t.Setenv("NATS_CA", "/etc/broadcast/ca.pem")
	t.Setenv("NATS_CERT", "/etc/broadcast/client.pem")
	t.Setenv("NATS_KEY", "")
	c := NATSConfigFromEnv()
	require.Equal(t, NATSConfig{URL: "tls://127.0.0.1:4222,tls://127.0.0.1:4223", User: "ingest", Password: "pw",
		CA: "/etc/broadcast/ca.pem", Cert: "/etc/broadcast/client.pem"}, c)
	_, err := Connect(c, "test", nil)
	require.ErrorContains(t, err, "NATS_CERT and NATS_KEY: set both or neither")

	t.Setenv("NATS_URL", "")
	require.Equal(t, DefaultNATSURL, NATSConfigFromEnv().URL)
}
