package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// floorShape is how a floor run lays out its jobs; the zero shape is
// -floor's: one job per message on one subject, one consumer.
type floorShape struct {
	// batch is the recipients per job message: that many jobs in the
	// pipeline's encoding, one per line, which the consumer decodes, then
	// encodes and publishes one sent event per job and acks the message
	// once all are stored. 0 is -floor's single job, passed as opaque
	// bytes against one pre-encoded event.
	batch int
	// accounts spreads the jobs round robin over that many subjects
	// (bench.floor.jobs.<i>), each with a consumer of its own filtering
	// it, like dispatch's lanes (MaxAckPending each, state in memory).
	accounts int
	// groups shares the accounts' subjects among that many consumers:
	// each lists its accounts' subjects in FilterSubjects or, with
	// wildcard, filters bench.floor.jobs.g<group>.* under which its
	// accounts' subjects lie.
	groups   int
	wildcard bool
	// transform leaves each account's subject as it is
	// (bench.floor.jobs.<i>) and has the stream append the account's
	// group as it stores the job (a subject transform with partition()),
	// so a group's consumer filters bench.floor.jobs.*.<group>.
	transform bool
	// shards splits the jobs stream into that many work-queue streams,
	// each holding the subjects (bench.floor.jobs.s<shard>.<i>) and the
	// consumers of every shards-th account, so an ack is checked against
	// the consumers of its own shard only.
	shards int
}

// label names the shape in the machine-readable line of its run.
func (s floorShape) label() string {
	var l []string
	switch {
	case s.groups > 0:
		filter := "subjects"
		switch {
		case s.wildcard:
			filter = "wildcard"
		case s.transform:
			filter = "transform"
		}
		l = append(l, fmt.Sprintf("floor_groups=%d floor_accounts=%d floor_filter=%s", s.groups, s.accounts, filter))
	case s.shards > 0:
		l = append(l, fmt.Sprintf("floor_shards=%d floor_accounts=%d", s.shards, s.accounts))
	case s.accounts > 0:
		l = append(l, fmt.Sprintf("floor_consumers=%d", s.accounts))
	}
	if s.batch > 0 {
		l = append(l, fmt.Sprintf("floor_batch=%d", s.batch))
	}
	if len(l) == 0 {
		return "floor"
	}
	return strings.Join(l, " ")
}

// subject is the jobs subject of account a.
func (s floorShape) subject(a int) string {
	switch {
	case s.accounts == 0:
		return "bench.floor.jobs"
	case s.groups > 0 && s.wildcard:
		return fmt.Sprintf("bench.floor.jobs.g%d.%d", a%s.groups, a)
	case s.shards > 0:
		return fmt.Sprintf("bench.floor.jobs.s%d.%d", a%s.shards, a)
	}
	return "bench.floor.jobs." + strconv.Itoa(a)
}

// streams are the jobs streams: one, or one per shard.
func (s floorShape) streams() []string {
	if s.shards == 0 {
		return []string{floorJobsStream}
	}
	names := make([]string, s.shards)
	for k := range names {
		names[k] = floorJobsStream + "_" + strconv.Itoa(k)
	}
	return names
}

// streamOf is the jobs stream holding account a's subject and consumer.
func (s floorShape) streamOf(a int) string {
	if s.shards == 0 {
		return floorJobsStream
	}
	return floorJobsStream + "_" + strconv.Itoa(a%s.shards)
}

const floorJobsStream = "BENCH_FLOOR_JOBS"

// consumers are the jobs streams' consumers, each with MaxAckPending
// slots, and the stream each belongs to.
func (s floorShape) consumers(slots int) ([]jetstream.ConsumerConfig, []string) {
	if s.accounts == 0 {
		return []jetstream.ConsumerConfig{{Durable: "dispatch", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: slots}}, []string{floorJobsStream}
	}
	n := s.accounts
	if s.groups > 0 {
		n = s.groups
	}
	cs, streams := make([]jetstream.ConsumerConfig, n), make([]string, n)
	for i := range cs {
		streams[i] = s.streamOf(i)
		cs[i] = jetstream.ConsumerConfig{Durable: "dispatch-" + strconv.Itoa(i), AckPolicy: jetstream.AckExplicitPolicy,
			MaxAckPending: slots, MemoryStorage: true}
	}
	for a := range s.accounts {
		switch {
		case s.groups == 0:
			cs[a].FilterSubject = s.subject(a)
		case s.wildcard:
			cs[a%s.groups].FilterSubject = fmt.Sprintf("bench.floor.jobs.g%d.*", a%s.groups)
		case s.transform:
			// partition() hashes the account's token, so which group an
			// account falls in is the server's: every group filters its
			// own token.
			cs[a%s.groups].FilterSubject = fmt.Sprintf("bench.floor.jobs.*.%d", a%s.groups)
		default:
			cs[a%s.groups].FilterSubjects = append(cs[a%s.groups].FilterSubjects, s.subject(a))
		}
	}
	return cs, streams
}

// benchFloor runs the bare per-recipient JetStream work of the pipeline,
// with none of the services' logic, on the same server: publish a job (with
// a Nats-Msg-Id, into a work-queue stream, waiting for the acks of every
// 500 like render), consume it (MaxAckPending concurrency), publish its sent
// event and acknowledge the job once the event is stored (like dispatch),
// and consume and acknowledge every event (like status, without the fold).
// Jobs and events are the pipeline's own encodings. What it reaches is what
// the pipeline could reach if its services cost nothing: the floor of the
// benchmark's design, and the measure of what the services add. shape
// varies the design (floorShape); with a batch, concurrency still counts
// recipients, so a consumer holds concurrency/batch messages (at least 1).
// Every consumer feeds one pool of that many workers, so the sends in
// flight across accounts are bounded as by dispatch's scheduler.
func benchFloor(ctx context.Context, js jetstream.JetStream, n, concurrency int, shape floorShape) (rate float64, cpuPer time.Duration, err error) {
	const eventsStream = "BENCH_FLOOR_EVENTS"
	// The server allows 1,000 consumers per stream unless the stream sets
	// a limit of its own (-1 counts as unset); JOBS allows 100,000.
	configs := []jetstream.StreamConfig{{Name: eventsStream, Subjects: []string{"bench.floor.events"}, Storage: jetstream.FileStorage}}
	for k, name := range shape.streams() {
		subjects := []string{"bench.floor.jobs", "bench.floor.jobs.>"}
		if shape.shards > 0 {
			subjects = []string{fmt.Sprintf("bench.floor.jobs.s%d.>", k)}
		}
		sc := jetstream.StreamConfig{Name: name, Subjects: subjects, Retention: jetstream.WorkQueuePolicy,
			Storage: jetstream.FileStorage, MaxConsumers: 100_000}
		if shape.transform {
			sc.Subjects = []string{"bench.floor.jobs.*"}
			sc.SubjectTransform = &jetstream.SubjectTransformConfig{Source: "bench.floor.jobs.*",
				Destination: fmt.Sprintf("bench.floor.jobs.{{wildcard(1)}}.{{partition(%d,1)}}", shape.groups)}
		}
		configs = append(configs, sc)
	}
	for _, sc := range configs {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return 0, 0, err
		}
		defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), sc.Name) }()
	}
	slots, perMsg, msgs := concurrency, 1, n
	if shape.batch > 0 {
		perMsg = shape.batch
		slots, msgs = max(1, (concurrency+perMsg-1)/perMsg), (n+perMsg-1)/perMsg
	}
	var jobs []jetstream.Consumer
	consumers, streams := shape.consumers(slots)
	for i, cc := range consumers {
		c, err := js.CreateOrUpdateConsumer(ctx, streams[i], cc)
		if err != nil {
			return 0, 0, fmt.Errorf("floor: consumer %s: %w", cc.Durable, err)
		}
		jobs = append(jobs, c)
	}
	events, err := js.CreateOrUpdateConsumer(ctx, eventsStream, jetstream.ConsumerConfig{
		Durable: "status", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 200_000})
	if err != nil {
		return 0, 0, err
	}
	now := time.Now().UTC()
	payload, handle, err := floorWork(js, shape.batch, now)
	if err != nil {
		return 0, 0, err
	}
	subjects := make([]string, max(shape.accounts, 1))
	for a := range subjects {
		subjects[a] = shape.subject(a)
	}

	start, cpu0 := time.Now(), cpuTime()
	folded := make(chan struct{})
	var count int
	var mu sync.Mutex
	total := msgs * perMsg
	statusCC, err := events.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		mu.Lock()
		if count++; count == total {
			close(folded)
		}
		mu.Unlock()
	}, jetstream.PullMaxMessages(2000))
	if err != nil {
		return 0, 0, err
	}
	defer statusCC.Stop()
	work, stop := make(chan jetstream.Msg, slots), make(chan struct{})
	defer close(stop)
	for range slots {
		go func() {
			for {
				var m jetstream.Msg
				select {
				case m = <-work:
				case <-stop:
					return
				}
				if handle(m) {
					_ = m.Ack()
				} else {
					_ = m.Nak()
				}
			}
		}()
	}
	for _, c := range jobs {
		cc, err := c.Consume(func(m jetstream.Msg) {
			select {
			case work <- m:
			case <-stop:
			}
		}, jetstream.PullMaxMessages(slots))
		if err != nil {
			return 0, 0, err
		}
		defer cc.Stop()
	}
	go func() {
		futures := make([]jetstream.PubAckFuture, 0, 500)
		for i := range msgs {
			f, err := js.PublishAsync(subjects[i%len(subjects)], payload, jetstream.WithMsgID("bench-floor."+strconv.Itoa(i)))
			if err != nil {
				return
			}
			if futures = append(futures, f); len(futures) == cap(futures) || i == msgs-1 {
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
		return 0, 0, fmt.Errorf("floor: %d of %d events after 10 minutes", count, total)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	return float64(total) / elapsed.Seconds(), cpu / time.Duration(total), nil
}

// floorWork returns the job message the floor publishes (every message
// the same bytes, told apart by their Nats-Msg-Id) and what a consumer
// does with one: publish its sent events and report whether all were
// stored. With batch 0 the message is one job and its event one
// pre-encoded message; otherwise the message is batch jobs, one per line,
// and each is decoded and its event encoded, as dispatch would.
func floorWork(js jetstream.JetStream, batch int, now time.Time) (payload []byte, handle func(jetstream.Msg) bool, err error) {
	job := func(i int) *contract.Job {
		to := fmt.Sprintf("+8613000%06d", i)
		return &contract.Job{ID: "bench-floor." + strconv.Itoa(i), TaskID: "bench-floor", Index: i, To: to,
			Body: "Hello " + to + ", your code is BENCH", Channel: "sandbox", Account: "bench-0", Priority: contract.PriorityNormal,
			MaxAttempts: 5, EnqueuedAt: now}
	}
	wait := func(futures []jetstream.PubAckFuture) bool {
		ok := true
		for _, f := range futures {
			select {
			case <-f.Ok():
			case <-f.Err():
				ok = false
			}
		}
		return ok
	}
	if batch == 0 {
		j := job(123456)
		if payload, err = contract.EncodeJob(j); err != nil {
			return nil, nil, err
		}
		event, err := contract.EncodeEvent(&contract.Event{TaskID: j.TaskID, JobID: j.ID, To: j.To,
			Account: j.Account, Kind: contract.EventSent, Index: j.Index, Attempt: 1, At: now, LatencyMS: 0.01})
		if err != nil {
			return nil, nil, err
		}
		return payload, func(jetstream.Msg) bool {
			f, err := js.PublishAsync("bench.floor.events", event)
			return err == nil && wait([]jetstream.PubAckFuture{f})
		}, nil
	}
	lines := make([]string, batch)
	for i := range lines {
		data, err := contract.EncodeJob(job(123456 + i))
		if err != nil {
			return nil, nil, err
		}
		lines[i] = string(data)
	}
	return []byte(strings.Join(lines, "\n")), func(m jetstream.Msg) bool {
		futures := make([]jetstream.PubAckFuture, 0, batch)
		for line := range bytes.SplitSeq(m.Data(), []byte{'\n'}) {
			var j contract.Job
			if contract.DecodeJob(line, &j) != nil {
				return false
			}
			event, err := contract.EncodeEvent(&contract.Event{TaskID: j.TaskID, JobID: j.ID, To: j.To,
				Account: j.Account, Kind: contract.EventSent, Index: j.Index, Attempt: 1, At: time.Now().UTC(), LatencyMS: 0.01})
			if err != nil {
				return false
			}
			f, err := js.PublishAsync("bench.floor.events", event)
			if err != nil {
				return false
			}
			futures = append(futures, f)
		}
		return wait(futures)
	}, nil
}

// floorRun is the result of one floor run.
type floorRun struct {
	shape  floorShape
	rate   float64
	cpuPer time.Duration
}

// runFloors runs the floor once per shape, in order.
func runFloors(ctx context.Context, js jetstream.JetStream, n, concurrency int, shapes []floorShape) ([]floorRun, error) {
	var runs []floorRun
	for _, s := range shapes {
		rate, cpuPer, err := benchFloor(ctx, js, n, concurrency, s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.label(), err)
		}
		runs = append(runs, floorRun{shape: s, rate: rate, cpuPer: cpuPer})
	}
	return runs, nil
}

// print writes the run's lines against the raw baseline rawRate and, for
// -floor, the pipeline's result res (nil when the pipeline did not run).
func (r floorRun) print(rawRate float64, res *benchResult) {
	cpuUS := float64(r.cpuPer.Nanoseconds()) / 1000
	if r.shape != (floorShape{}) {
		fmt.Printf("%s floor_recipients_per_sec=%.0f floor_ratio=%.3f floor_cpu_us_per_recipient=%.1f\n", r.shape.label(), r.rate, r.rate/rawRate, cpuUS)
		return
	}
	reach := ""
	if res != nil {
		reach = fmt.Sprintf("; the pipeline reaches %.2f of it", res.e2eRate/r.rate)
	}
	fmt.Printf("floor (the same JetStream work per recipient, no services): %.0f recipients/s, %.1f µs CPU per recipient%s\n", r.rate, cpuUS, reach)
	fmt.Printf("floor_recipients_per_sec=%.0f floor_ratio=%.3f\n", r.rate, r.rate/rawRate)
}

// floorShapes are the floor runs that -floor-batch, -floor-consumers,
// -floor-groups and -floor-shards (over accounts) ask for, in that order;
// the runs with consumers carry accountBatch recipients per job message.
func floorShapes(batch, consumers, groups, shards string, accounts, accountBatch int) ([]floorShape, error) {
	var shapes []floorShape
	for _, f := range []struct {
		name, list string
		add        func(int)
	}{
		{"floor-batch", batch, func(k int) { shapes = append(shapes, floorShape{batch: k}) }},
		{"floor-consumers", consumers, func(n int) { shapes = append(shapes, floorShape{accounts: n, batch: accountBatch}) }},
		{"floor-groups", groups, func(g int) {
			shapes = append(shapes, floorShape{accounts: accounts, groups: g, batch: accountBatch},
				floorShape{accounts: accounts, groups: g, wildcard: true, batch: accountBatch},
				floorShape{accounts: accounts, groups: g, transform: true, batch: accountBatch})
		}},
		{"floor-shards", shards, func(k int) { shapes = append(shapes, floorShape{accounts: accounts, shards: k, batch: accountBatch}) }},
	} {
		if f.list == "" {
			continue
		}
		for _, v := range strings.Split(f.list, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || k < 1 {
				return nil, fmt.Errorf("bench: -%s: %q is not a positive number", f.name, v)
			}
			if (f.name == "floor-groups" || f.name == "floor-shards") && k > accounts {
				return nil, fmt.Errorf("bench: -%s: %d for %d accounts", f.name, k, accounts)
			}
			f.add(k)
		}
	}
	return shapes, nil
}
