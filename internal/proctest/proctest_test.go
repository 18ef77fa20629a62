package proctest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/gateway"
)

// TestNATSRestartKeepsStoreAndPort kills nats-server, restarts it on the same
// port and store, and reads back what was written before the kill through
// the same (reconnected) client.
func TestNATSRestartKeepsStoreAndPort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs binaries")
	}
	ns := StartNATS(t, t.TempDir(), 0)
	require.True(t, strings.HasPrefix(ns.URL, "nats://127.0.0.1:"), ns.URL)
	nc, err := nats.Connect(ns.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "k", []byte("v"))
	require.NoError(t, err)

	pid := ns.Pid()
	ns.Kill()
	require.False(t, ns.Running())
	require.Error(t, ns.ExitErr(), "killed, so not a clean exit")
	ns.Restart()
	require.True(t, ns.Running())
	require.NotEqual(t, pid, ns.Pid())
	require.Equal(t, 2, ns.Starts())

	require.Eventually(t, nc.IsConnected, 10*time.Second, 20*time.Millisecond)
	e, err := kv.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(e.Value()))
	require.Equal(t, 2, ns.CountLog("=== proctest nats: start #"))
	require.Contains(t, ns.Logs(), "signal: killed")
}

// TestGatewayServesLedger starts the gateway and reads its empty ledger.
func TestGatewayServesLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs binaries")
	}
	gw := StartGateway(t, "-seed", "3")
	WaitForHTTP(t, gw.URL+"/ledger")
	l, err := gateway.FetchLedger(context.Background(), gw.URL)
	require.NoError(t, err)
	require.Zero(t, l.Requests)
	gw.Stop()
	require.False(t, gw.Running())
	require.NoError(t, gw.ExitErr(), "SIGTERM is a graceful stop")
	require.Contains(t, gw.Logs(), "gateway stopped")
}

// TestKillReachesChildren checks that Kill takes the whole process group:
// a shell's background child dies with it.
func TestKillReachesChildren(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	p := Start(t, Spec{Name: "sh", Path: "/bin/sh", Args: []string{"-c", "sleep 300 & echo $! > " + pidFile + "; wait"}})
	var child int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && child > 0
	}, 5*time.Second, 10*time.Millisecond)
	require.True(t, alive(child))
	p.Kill()
	require.Eventually(t, func() bool { return !alive(child) }, 5*time.Second, 10*time.Millisecond, "child %d survived", child)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
