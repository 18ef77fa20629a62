package shared_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// TestKVViewAfterServerRestart: a view must show a write made right after
// nats-server restarted, within a second. The watch's own recovery waits
// for missed heartbeats, seconds during which a view said "processing"
// for a paused task and a resume did nothing (scenario seed 482999897).
func TestKVViewAfterServerRestart(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	srv, err := embedded.Start(embedded.Config{Port: port, StoreDir: dir})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Shutdown() })

	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "view"})
	require.NoError(t, err)
	_, err = kv.PutString(ctx, "task", "processing")
	require.NoError(t, err)
	_, err = kv.PutString(ctx, "gone", "x")
	require.NoError(t, err)

	changed := make(chan string, 16)
	view, err := shared.WatchKV(ctx, js, "view", func(b []byte) (string, error) { return string(b), nil },
		slog.New(slog.DiscardHandler), func(key string) { changed <- key })
	require.NoError(t, err)
	got, _ := view.Get("task")
	require.Equal(t, "processing", got)

	srv.Shutdown()
	srv.WaitForShutdown()
	srv, err = embedded.Start(embedded.Config{Port: port, StoreDir: dir})
	require.NoError(t, err)
	require.Eventually(t, nc.IsConnected, 10*time.Second, 10*time.Millisecond)

	_, err = kv.PutString(ctx, "task", "paused")
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "gone"))
	written := time.Now()
	require.Eventually(t, func() bool {
		v, _ := view.Get("task")
		_, has := view.Get("gone")
		return v == "paused" && !has
	}, time.Second, 5*time.Millisecond, "the view shows the writes made after the restart")
	t.Logf("the view caught up %s after the writes", time.Since(written).Round(time.Millisecond))
	keys := map[string]bool{}
	for len(changed) > 0 {
		keys[<-changed] = true
	}
	require.Equal(t, map[string]bool{"task": true, "gone": true}, keys, "onChange told of both keys")
}

// TestKVViewRefreshOutrunsAStaleWatch: a view whose watch has stopped
// delivering (fallen behind) shows the bucket's value once Refresh read it,
// and a missing key reads as absent without touching the view.
func TestKVViewRefreshOutrunsAStaleWatch(t *testing.T) {
	srv, err := embedded.Start(embedded.Config{Port: -1, StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "view"})
	require.NoError(t, err)
	_, err = kv.PutString(t.Context(), "task", "paused")
	require.NoError(t, err)

	watching, stopWatch := context.WithCancel(t.Context())
	view, err := shared.WatchKV(watching, js, "view", func(b []byte) (string, error) { return string(b), nil },
		slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	stopWatch()
	time.Sleep(100 * time.Millisecond) // the watch has stopped
	_, err = kv.PutString(t.Context(), "task", "processing")
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	got, _ := view.Get("task")
	require.Equal(t, "paused", got, "the stopped watch did not deliver the write")

	val, ok, err := view.Refresh(t.Context(), "task")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "processing", val)
	got, _ = view.Get("task")
	require.Equal(t, "processing", got, "Refresh brought the view up to the bucket")

	_, ok, err = view.Refresh(t.Context(), "nothing")
	require.NoError(t, err)
	require.False(t, ok)
	_, ok = view.Get("nothing")
	require.False(t, ok)
}
