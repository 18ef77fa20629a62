package shared_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

func pubStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(context.Background(), cfg)
	require.NoError(t, err)
	return st
}

func streamMsgs(t testing.TB, st jetstream.Stream) uint64 {
	t.Helper()
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	return info.State.Msgs
}

// TestPublisherStoresAndDedups: every publication settles once its message
// is stored, a repeated Nats-Msg-Id settles as stored without a second
// copy, and messages without an id are all kept.
func TestPublisherStoresAndDedups(t *testing.T) {
	ts := natstest.Start(t)
	ctx := context.Background()
	st := pubStream(t, ts.JS, jetstream.StreamConfig{Name: "PUB", Subjects: []string{"pub.>"}, Duplicates: time.Minute})
	p, err := shared.NewPublisher(ts.NC, 100, 5*time.Second)
	require.NoError(t, err)
	defer p.Close()

	const n = 1000
	var pubs []*shared.Publication
	for i := range n {
		f, err := p.Publish(ctx, "pub.a", []byte("m"+strconv.Itoa(i)), "id-"+strconv.Itoa(i%(n/2)))
		require.NoError(t, err)
		pubs = append(pubs, f)
	}
	for i := range 10 {
		f, err := p.Publish(ctx, "pub.b", []byte("plain"), "")
		require.NoError(t, err, i)
		pubs = append(pubs, f)
	}
	for i, f := range pubs {
		require.NoError(t, f.Wait(ctx), "publication %d", i)
	}
	require.EqualValues(t, n/2+10, streamMsgs(t, st), "the second half repeats the first half's ids")
	require.Zero(t, p.Pending())
}

// TestPublisherReportsRefusals: a stream's refusal comes back as its API
// error, a subject no stream takes as "no responders" after the retries,
// and a message nobody answers as a timeout.
func TestPublisherReportsRefusals(t *testing.T) {
	ts := natstest.Start(t)
	ctx := context.Background()
	pubStream(t, ts.JS, jetstream.StreamConfig{Name: "FULL", Subjects: []string{"full"}, MaxMsgs: 1, Discard: jetstream.DiscardNew})
	p, err := shared.NewPublisher(ts.NC, 10, 300*time.Millisecond)
	require.NoError(t, err)
	defer p.Close()

	first, err := p.Publish(ctx, "full", []byte("1"), "")
	require.NoError(t, err)
	require.NoError(t, first.Wait(ctx))
	second, err := p.Publish(ctx, "full", []byte("2"), "")
	require.NoError(t, err)
	var apiErr *jetstream.APIError
	require.ErrorAs(t, second.Wait(ctx), &apiErr)
	require.Contains(t, apiErr.Description, "maximum messages")

	start := time.Now()
	none, err := p.Publish(ctx, "nostream", []byte("x"), "")
	require.NoError(t, err)
	require.ErrorIs(t, none.Wait(ctx), jetstream.ErrNoStreamResponse)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "two retries a quarter second apart")

	// A core subscriber takes the message and never answers.
	sub, err := ts.NC.SubscribeSync("silent")
	require.NoError(t, err)
	defer sub.Unsubscribe()
	start = time.Now()
	silent, err := p.Publish(ctx, "silent", []byte("x"), "")
	require.NoError(t, err)
	require.ErrorIs(t, silent.Wait(ctx), jetstream.ErrAsyncPublishTimeout)
	require.Less(t, time.Since(start), 2*time.Second)
	require.Zero(t, p.Pending())
}

// TestPublisherBoundsPending: with maxPending unanswered messages, Publish
// waits for room until its context ends; Close fails what is pending.
func TestPublisherBoundsPending(t *testing.T) {
	ts := natstest.Start(t)
	sub, err := ts.NC.SubscribeSync("silent")
	require.NoError(t, err)
	defer sub.Unsubscribe()
	p, err := shared.NewPublisher(ts.NC, 3, time.Hour)
	require.NoError(t, err)

	var pubs []*shared.Publication
	for range 3 {
		f, err := p.Publish(context.Background(), "silent", []byte("x"), "")
		require.NoError(t, err)
		pubs = append(pubs, f)
	}
	require.Equal(t, 3, p.Pending())
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = p.Publish(ctx, "silent", []byte("x"), "")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	p.Close()
	for _, f := range pubs {
		require.ErrorIs(t, f.Wait(context.Background()), shared.ErrPublisherClosed)
	}
	_, err = p.Publish(context.Background(), "silent", []byte("x"), "")
	require.ErrorIs(t, err, shared.ErrPublisherClosed)
}

// TestPublisherFailsPendingOnDisconnect: acks in flight are lost with the
// connection, so their publications fail at once instead of at the
// timeout.
func TestPublisherFailsPendingOnDisconnect(t *testing.T) {
	ts := natstest.Start(t)
	nc, err := nats.Connect(ts.URL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	defer nc.Close()
	sub, err := ts.NC.SubscribeSync("silent")
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, ts.NC.Flush())
	p, err := shared.NewPublisher(nc, 10, time.Hour)
	require.NoError(t, err)
	defer p.Close()
	f, err := p.Publish(context.Background(), "silent", []byte("x"), "")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	start := time.Now()
	ts.Server.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.ErrorIs(t, f.Wait(ctx), nats.ErrDisconnected)
	require.Less(t, time.Since(start), 2*time.Second)
}

// BenchmarkPublish compares the Publisher with jetstream's PublishAsync on
// the pipeline's kinds of message, a job with its Nats-Msg-Id and a sent
// event without one: time and allocations per message, for client and
// server together.
func BenchmarkPublish(b *testing.B) {
	body := []byte(`{"id":"bench-task.123456","task_id":"bench-task","index":123456,"to":"+8613000123456","body":"Hello +8613000123456, your code is BENCH","channel":"sandbox","account":"bench-0","priority":"normal","max_attempts":5}`)
	for _, kind := range []string{"job", "event"} {
		for _, via := range []string{"PublishAsync", "Publisher"} {
			b.Run(kind+"/"+via, func(b *testing.B) {
				ts := natstest.Start(b)
				st := pubStream(b, ts.JS, jetstream.StreamConfig{Name: "PUBBENCH", Subjects: []string{"pubbench"}, Storage: jetstream.FileStorage})
				p, err := shared.NewPublisher(ts.NC, 4000, 30*time.Second)
				require.NoError(b, err)
				defer p.Close()
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					id := ""
					if kind == "job" {
						id = "bench-task." + strconv.Itoa(i)
					}
					i++
					var err error
					switch {
					case via == "Publisher":
						_, err = p.Publish(ctx, "pubbench", body, id)
					case id != "":
						_, err = ts.JS.PublishAsync("pubbench", body, jetstream.WithMsgID(id))
					default:
						_, err = ts.JS.PublishAsync("pubbench", body)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				deadline := time.Now().Add(30 * time.Second)
				for streamMsgs(b, st) < uint64(i) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				if got := streamMsgs(b, st); got != uint64(i) {
					b.Fatal(fmt.Errorf("stored %d of %d", got, i))
				}
			})
		}
	}
}

// TestPublisherReleasesRoomOnSendError: a publication the connection
// refuses fails with the connection's error and frees its room exactly
// once, so later ones neither block nor overfill (maxPending 1, five
// refused publishes in a row).
func TestPublisherReleasesRoomOnSendError(t *testing.T) {
	ts := natstest.Start(t)
	nc, err := nats.Connect(ts.URL)
	require.NoError(t, err)
	p, err := shared.NewPublisher(nc, 1, time.Hour)
	require.NoError(t, err)
	defer p.Close()
	nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 5 {
		pub, err := p.Publish(ctx, "pub.x", []byte("x"), "")
		require.NoError(t, err, "publish %d", i)
		err = pub.Wait(ctx)
		// Refused as it was written, or failed with the rest when the
		// publisher saw the connection close.
		require.True(t, errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected), "publish %d: %v", i, err)
		require.Zero(t, p.Pending())
	}
}

// TestPublisherCloseSettlesEverything: publications racing a Close all
// settle, stored or failed as closed, and none after it hangs.
func TestPublisherCloseSettlesEverything(t *testing.T) {
	ts := natstest.Start(t)
	pubStream(t, ts.JS, jetstream.StreamConfig{Name: "PUB", Subjects: []string{"pub.>"}})
	for round := range 20 {
		p, err := shared.NewPublisher(ts.NC, 64, 5*time.Second)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var wg sync.WaitGroup
		var settled, refused atomic.Int64
		for g := range 8 {
			wg.Go(func() {
				for i := range 50 {
					pub, err := p.Publish(ctx, "pub.x", []byte(fmt.Sprint(g, i)), "")
					if err != nil {
						assert.ErrorIs(t, err, shared.ErrPublisherClosed)
						refused.Add(1)
						continue
					}
					if err := pub.Wait(ctx); err != nil {
						assert.ErrorIs(t, err, shared.ErrPublisherClosed)
					}
					settled.Add(1)
				}
			})
		}
		time.Sleep(time.Duration(round) * time.Millisecond)
		p.Close()
		wg.Wait()
		require.NoError(t, ctx.Err(), "round %d: a publication never settled", round)
		cancel()
		require.Equal(t, int64(400), settled.Load()+refused.Load(), "round %d", round)
	}
}
