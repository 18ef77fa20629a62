package status

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestIndexWriterKeepsEveryEntryWhenTheIngestQueueIsSmall publishes far
// more entries than the server's stream ingest queue holds, as fast as the
// writer lets it, and checks that the stream stored every one: the sampled
// acknowledgements must hold the writer back before the queue drops any.
// Publishing them all without waiting (ackEvery above n) loses some.
func TestIndexWriterKeepsEveryEntryWhenTheIngestQueueIsSmall(t *testing.T) {
	t.Parallel()
	const n, queue = 40_000, 500
	stored := func(ackEvery int) uint64 {
		opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			StreamMaxBufferedMsgs: queue, NoLog: true, NoSigs: true}
		srv, err := server.NewServer(opts)
		require.NoError(t, err)
		srv.SetLogger(nil, false, false)
		go srv.Start()
		require.True(t, srv.ReadyForConnections(10*time.Second))
		defer srv.Shutdown()
		nc, err := nats.Connect(srv.ClientURL())
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDX", Subjects: []string{"idx.>"}, Storage: jetstream.FileStorage})
		require.NoError(t, err)
		w := &indexWriter{js: js, ackEvery: ackEvery, inFlight: 4, timeout: 10 * time.Second}
		data := make([]byte, 200)
		for i := range n {
			id := strconv.Itoa(i)
			require.NoError(t, w.publish(indexEntry{subject: "idx." + id, data: data, msgID: id}))
		}
		require.NoError(t, nc.Flush())
		var last uint64
		for range 50 { // until the count stops moving
			time.Sleep(100 * time.Millisecond)
			info, err := stream.Info(ctx)
			require.NoError(t, err)
			if info.State.Msgs == last && last > 0 {
				break
			}
			last = info.State.Msgs
		}
		return last
	}
	require.EqualValues(t, n, stored(64), "with sampled acknowledgements every entry is stored")
	require.Less(t, stored(n+1), uint64(n), "without them the small ingest queue drops entries, so this test can fail")
}
