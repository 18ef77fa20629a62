package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// benchFloor runs the bare per-recipient JetStream work of the pipeline,
// with none of the services' logic, on the same server: publish a job (with
// a Nats-Msg-Id, into a work-queue stream, waiting for the acks of every
// 500 like render), consume it (MaxAckPending concurrency), publish its sent
// event and acknowledge the job once the event is stored (like dispatch),
// and consume and acknowledge every event (like status, without the fold).
// Jobs and events are the pipeline's own encodings. What it reaches is what
// the pipeline could reach if its services cost nothing: the floor of the
// benchmark's design, and the measure of what the services add.
func benchFloor(ctx context.Context, js jetstream.JetStream, n, concurrency int) (rate float64, cpuPer time.Duration, err error) {
	const jobsStream, eventsStream = "BENCH_FLOOR_JOBS", "BENCH_FLOOR_EVENTS"
	for _, sc := range []jetstream.StreamConfig{
		{Name: jobsStream, Subjects: []string{"bench.floor.jobs"}, Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage},
		{Name: eventsStream, Subjects: []string{"bench.floor.events"}, Storage: jetstream.FileStorage},
	} {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return 0, 0, err
		}
		defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), sc.Name) }()
	}
	jobs, err := js.CreateOrUpdateConsumer(ctx, jobsStream, jetstream.ConsumerConfig{
		Durable: "dispatch", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: concurrency})
	if err != nil {
		return 0, 0, err
	}
	events, err := js.CreateOrUpdateConsumer(ctx, eventsStream, jetstream.ConsumerConfig{
		Durable: "status", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 200_000})
	if err != nil {
		return 0, 0, err
	}
	now := time.Now().UTC()
	job, err := contract.EncodeJob(&contract.Job{ID: "bench-floor.123456", TaskID: "bench-floor", Index: 123456, To: "+8613000123456",
		Body: "Hello +8613000123456, your code is BENCH", Channel: "sandbox", Account: "bench-0", Priority: contract.PriorityNormal,
		MaxAttempts: 5, EnqueuedAt: now})
	if err != nil {
		return 0, 0, err
	}
	event, err := contract.EncodeEvent(&contract.Event{TaskID: "bench-floor", JobID: "bench-floor.123456", To: "+8613000123456",
		Account: "bench-0", Kind: contract.EventSent, Index: 123456, Attempt: 1, At: now, LatencyMS: 0.01})
	if err != nil {
		return 0, 0, err
	}

	start, cpu0 := time.Now(), cpuTime()
	folded := make(chan struct{})
	var count int
	var mu sync.Mutex
	statusCC, err := events.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		mu.Lock()
		if count++; count == n {
			close(folded)
		}
		mu.Unlock()
	}, jetstream.PullMaxMessages(2000))
	if err != nil {
		return 0, 0, err
	}
	defer statusCC.Stop()
	work, stop := make(chan jetstream.Msg, concurrency), make(chan struct{})
	defer close(stop)
	for range concurrency {
		go func() {
			for {
				var m jetstream.Msg
				select {
				case m = <-work:
				case <-stop:
					return
				}
				f, err := js.PublishAsync("bench.floor.events", event)
				if err != nil {
					_ = m.Nak()
					continue
				}
				select {
				case <-f.Ok():
					_ = m.Ack()
				case <-f.Err():
					_ = m.Nak()
				}
			}
		}()
	}
	dispatchCC, err := jobs.Consume(func(m jetstream.Msg) {
		select {
		case work <- m:
		case <-stop:
		}
	}, jetstream.PullMaxMessages(concurrency))
	if err != nil {
		return 0, 0, err
	}
	defer dispatchCC.Stop()
	go func() {
		futures := make([]jetstream.PubAckFuture, 0, 500)
		for i := range n {
			f, err := js.PublishAsync("bench.floor.jobs", job, jetstream.WithMsgID("bench-floor."+strconv.Itoa(i)))
			if err != nil {
				return
			}
			if futures = append(futures, f); len(futures) == cap(futures) || i == n-1 {
				for _, f := range futures {
					select {
					case <-f.Ok():
					case <-f.Err():
					}
				}
				futures = futures[:0]
			}
		}
	}()
	select {
	case <-folded:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(10 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		return 0, 0, fmt.Errorf("floor: %d of %d events after 10 minutes", count, n)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	return float64(n) / elapsed.Seconds(), cpu / time.Duration(n), nil
}
