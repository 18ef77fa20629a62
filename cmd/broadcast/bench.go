package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/services/dispatch"
	"github.com/broadcastd/broadcast/services/ingest"
	"github.com/broadcastd/broadcast/services/render"
	"github.com/broadcastd/broadcast/services/status"
	"github.com/broadcastd/broadcast/shared"
)

// runBench measures the whole pipeline against raw JetStream publishing on
// the same embedded server, in the same run, so the ratio is meaningful on
// a noisy machine.
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	n := fs.Int("n", 200_000, "recipients in the benchmark task")
	raw := fs.Int("raw", 0, "messages in the raw JetStream baseline (default: n)")
	replicas := fs.String("replicas", "", "comma-separated dispatch replica counts to compare against a 20 ms provider, e.g. 1,2,4")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file: of the task's run, from its submission to its final progress (with -pipeline=false, of the floor runs)")
	memProfile := fs.String("memprofile", "", "write an allocation profile (after the pipeline run) to this file")
	// The sandbox answers at once, so the account's concurrency (its
	// consumers' MaxAckPending) only bounds the jobs between delivery and
	// ack: with 256, a job's round trip on the saturated machine (256 slots
	// at 20k/s: 12.8 ms, mostly queued behind other goroutines) held the
	// pipeline back (ratio 0.192-0.206 against 0.205-0.226 alternating).
	concurrency := fs.Int("concurrency", contract.MaxConcurrency, "the benchmark account's concurrency (its consumers' MaxAckPending)")
	floor := fs.Bool("floor", false, "also run the bare per-recipient JetStream work without the services (the design's floor) on the same server")
	floorBatch := fs.String("floor-batch", "", "comma-separated recipients per job message, e.g. 1,4,16,64: one floor run each, jobs decoded and events encoded")
	floorConsumers := fs.String("floor-consumers", "", "comma-separated account counts, e.g. 1,3,30,300,1000: one floor run each, jobs spread over one filtered consumer per account")
	floorGroups := fs.String("floor-groups", "", "comma-separated group counts, e.g. 8,16: three floor runs each, -floor-accounts spread over that many consumers listing their subjects, then filtering one wildcard per group, then one group token the stream's subject transform appends")
	floorShards := fs.String("floor-shards", "", "comma-separated shard counts, e.g. 4,16: one floor run each, -floor-accounts (one consumer each) spread over that many work-queue streams")
	floorAccounts := fs.Int("floor-accounts", 1000, "accounts the -floor-groups and -floor-shards runs spread their jobs over")
	floorAccountBatch := fs.Int("floor-accounts-batch", 0, "recipients per job message in the -floor-consumers, -floor-groups and -floor-shards runs (0: one job, opaque, as -floor)")
	pipeline := fs.Bool("pipeline", true, "run the pipeline; with false, only the raw baseline and the floor runs asked for")
	accounts := fs.Int("accounts", 1, "sandbox accounts the task is spread over (they share -rate)")
	idleAccounts := fs.Int("idle-accounts", 0, "more sandbox accounts, configured like -accounts but not named by the task")
	rate := fs.Float64("rate", 0, "the accounts' total rate_per_sec, split evenly between them (0: 1,000,000 each, no pacing)")
	burst := fs.Int("burst", 0, "each account's burst with -rate (0: a tenth of a second of its rate, at least 1)")
	statusReplicas := fs.Int("status-replicas", 1, "status processes (each folds its share of the partitions, the others stand by)")
	statusPartitions := fs.Int("status-partitions", 1, "partitions of the fold of the tasks (STATUS_PARTITIONS), spread over -status-replicas")
	timeline := fs.Bool("timeline", false, "print how many sent events were stored in each 250 ms after the task's acceptance (stalls, ramp-up and tail)")
	idle := fs.Duration("idle", 0, "before the task, measure the CPU the idle pipeline spends with its accounts for this long")
	suppressions := fs.Int("suppressions", 0, "entries in the suppression list (scope all) during the run; every 100th recipient of the task is one of them, the rest are other people")
	policyValue := fs.String("policy", "", `a recipient policy (KV broadcast_policy key default) in force during the run, e.g. '{"frequency_caps":[{"max":6,"window":"168h"}]}'`)
	_ = fs.Parse(args)
	if *suppressions < 0 {
		return fmt.Errorf("bench: -suppressions must not be negative")
	}
	if *floorAccountBatch < 0 {
		return fmt.Errorf("bench: -floor-accounts-batch must not be negative")
	}
	if *burst < 0 {
		return fmt.Errorf("bench: -burst must not be negative")
	}
	if *accounts < 1 || *statusReplicas < 1 {
		return fmt.Errorf("bench: -accounts and -status-replicas must be at least 1")
	}
	if *idleAccounts < 0 {
		return fmt.Errorf("bench: -idle-accounts must not be negative")
	}
	if *raw == 0 {
		*raw = *n
	}
	shapes, err := floorShapes(*floorBatch, *floorConsumers, *floorGroups, *floorShards, *floorAccounts, *floorAccountBatch)
	if err != nil {
		return err
	}
	if *floor {
		shapes = append([]floorShape{{}}, shapes...)
	}
	log, err := shared.NewLogger(os.Stderr, shared.LogConfig{Format: os.Getenv("LOG_FORMAT"), Level: "error"})
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "broadcast-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, nc, js, err := startEmbedded(ctx, embedded.Config{StoreDir: dir}, log)
	if err != nil {
		return err
	}
	defer s.Shutdown()
	defer nc.Close()

	if *replicas != "" {
		return benchReplicas(ctx, js, *replicas)
	}
	if *policyValue != "" {
		if err := putBenchPolicy(ctx, js, *policyValue); err != nil {
			return err
		}
	}
	if *suppressions > 0 {
		if err := fillBenchSuppressions(ctx, js, *suppressions, *n); err != nil {
			return err
		}
	}

	// The baseline runs before and after the pipeline, and the ratio uses
	// their mean: a single short run is at the mercy of whatever else the
	// machine does for those two seconds.
	stage := "the pipeline"
	if !*pipeline {
		stage = "the floor runs"
	}
	rawBefore, err := rawBaseline(ctx, js, *raw, "before "+stage)
	if err != nil {
		return err
	}

	var taskProfile io.Writer
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if !*pipeline {
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		taskProfile = f
	}
	var res *benchResult
	if *pipeline {
		perAccount, accountBurst := 1_000_000.0, 100_000
		if *rate > 0 {
			perAccount = *rate / float64(*accounts)
			accountBurst = max(1, int(perAccount/10))
			if *burst > 0 {
				accountBurst = *burst
			}
		}
		res, err = benchPipeline(ctx, js, *n, fmt.Sprintf(`{"channel":"sandbox","rate_per_sec":%g,"burst":%d,"concurrency":%d}`, perAccount, accountBurst, *concurrency),
			*accounts, *idleAccounts, 1, serviceOverrides{statusReplicas: *statusReplicas, statusPartitions: *statusPartitions, taskProfile: taskProfile}, *idle)
		if err != nil {
			return err
		}
		res.print()
		if *timeline {
			res.printTimeline(250 * time.Millisecond)
		}
		if *memProfile != "" {
			if err := writeHeapProfile(*memProfile); err != nil {
				return err
			}
		}
	}
	// Without the pipeline, the baseline runs before and after the floor
	// runs instead.
	var floors []floorRun
	if !*pipeline {
		if floors, err = runFloors(ctx, js, *n, *concurrency, shapes); err != nil {
			return err
		}
	}
	rawAfter, err := rawBaseline(ctx, js, *raw, "after "+stage)
	if err != nil {
		return err
	}
	if *pipeline {
		if floors, err = runFloors(ctx, js, *n, *concurrency, shapes); err != nil {
			return err
		}
	}
	rawRate := (rawBefore + rawAfter) / 2
	for _, f := range floors {
		f.print(rawRate, res)
	}
	if res != nil {
		fmt.Printf("e2e_recipients_per_sec=%.0f raw_js_pub_per_sec=%.0f ratio=%.3f\n", res.e2eRate, rawRate, res.e2eRate/rawRate)
	}
	return nil
}

// fillBenchSuppressions writes count entries in scope all to KV
// broadcast_suppressions before the services start (so dispatch's view
// loads them as it would after a restart): every 100th of the task's n
// recipients (the same numbers benchPipeline sends to), then other
// numbers up to count.
func fillBenchSuppressions(ctx context.Context, js jetstream.JetStream, count, n int) error {
	start := time.Now()
	at := start.UTC()
	in := 0
	for i := range count {
		to := fmt.Sprintf("+8614%09d", i)
		if i*100 < n {
			to, in = fmt.Sprintf("+8613%09d", i*100), in+1
		}
		e := contract.Suppression{To: to, Reason: "manual", Source: "bench", At: at}
		key, err := suppress.Prepare(contract.ScopeAll, &e)
		if err != nil {
			return fmt.Errorf("bench: suppression %d: %w", i, err)
		}
		data, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if _, err := js.PublishAsync("$KV."+contract.BucketSuppressions+"."+key, data); err != nil {
			return fmt.Errorf("bench: write suppression %d: %w", i, err)
		}
		if i%2_000 == 1_999 { // keep the outstanding publishes under the client's limit
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Printf("suppressions: %d entries written in %s (%d of them recipients of the task, skipped with code suppressed)\n",
		count, time.Since(start).Round(time.Millisecond), in)
	return nil
}

// rawBaseline runs and prints one baseline run.
func rawBaseline(ctx context.Context, js jetstream.JetStream, n int, when string) (float64, error) {
	cpu0 := cpuTime()
	rate, err := benchRawPublish(ctx, js, n)
	if err != nil {
		return 0, err
	}
	fmt.Printf("raw JetStream (%s): %d async publishes of 200 bytes with Nats-Msg-Id: %.0f msg/s, %.1f µs CPU each\n",
		when, n, rate, float64((cpuTime()-cpu0).Microseconds())/float64(n))
	return rate, nil
}

// benchRawPublish is the baseline: async publishes of 200-byte messages
// with a Nats-Msg-Id into a file-backed stream.
func benchRawPublish(ctx context.Context, js jetstream.JetStream, n int) (float64, error) {
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RAW", Subjects: []string{"bench.raw"}, Storage: jetstream.FileStorage}); err != nil {
		return 0, err
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), "BENCH_RAW") }()
	payload := []byte(strings.Repeat("x", 200))
	start := time.Now()
	for i := range n {
		if _, err := js.PublishAsync("bench.raw", payload, jetstream.WithMsgID("raw-"+strconv.Itoa(i))); err != nil {
			return 0, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

type benchResult struct {
	n          int
	elapsed    time.Duration
	e2eRate    float64
	ingestDone time.Duration
	renderDone time.Duration
	finalSeen  time.Duration // when the final progress was read
	firstSend  time.Duration
	// firstSent and lastSent are the stored times of the first and last
	// sent events: dispatch's own span.
	firstSent, lastSent time.Time
	start               time.Time
	p50, p99            time.Duration
	peakRSSMB           float64
	cpu                 time.Duration // CPU time of this process from submit to the final progress
	final               *contract.Progress
	dispatchReplicas    int
	accounts            int
	idleAccounts        int // configured, not named by the task
	statusReplicas      int
	providerLatencyStr  string
	// sessions is dispatch's account sessions and lease refreshes, read
	// from its metrics once the task is final.
	sessions string
	// jobMessages is how many messages JOBS stored for the task: job
	// groups, jobs alone, retries and moved copies.
	jobMessages uint64
	// healthWrites is how many account health values dispatch wrote
	// from the task's submission until it was final.
	healthWrites uint64
	// sched is how long goroutines waited runnable, from the submit to
	// the final progress (bench_sched.go).
	sched schedSummary
	// sends is each sent event's stored time after the task's acceptance,
	// in order; sentAt each one's send time (the event's at), in order.
	sends, sentAt []time.Duration
}

func (r *benchResult) print() {
	idle := ""
	if r.idleAccounts > 0 {
		idle = fmt.Sprintf(" (and %d idle)", r.idleAccounts)
	}
	fmt.Printf("pipeline: %d recipients over %d account(s)%s, %d dispatch replica(s), %d status replica(s)%s: final state %s, sent %d, skipped %d in %s\n",
		r.n, r.accounts, idle, r.dispatchReplicas, r.statusReplicas, r.providerLatencyStr, r.final.State, r.final.Sent, r.final.Skipped, r.elapsed.Round(time.Millisecond))
	fmt.Printf("  stages: accepted (ingest expanded) after %s, all jobs rendered after %s, first send after %s, last send after %s, final progress read after %s\n",
		r.ingestDone.Round(time.Millisecond), r.renderDone.Round(time.Millisecond), r.firstSend.Round(time.Millisecond),
		r.lastSent.Sub(r.start).Round(time.Millisecond), r.finalSeen.Round(time.Millisecond))
	perSec := func(d time.Duration) float64 { return float64(r.n) / max(d.Seconds(), 1e-3) }
	fmt.Printf("  per stage: ingest %.0f/s, render %.0f/s (from accepted), dispatch %.0f/s (first to last send), status %s behind the last send\n",
		perSec(r.ingestDone), perSec(r.renderDone-r.ingestDone), perSec(r.lastSent.Sub(r.firstSent)),
		(r.finalSeen - r.lastSent.Sub(r.start)).Round(time.Millisecond))
	fmt.Printf("  throughput: %.0f recipients/s end to end, %.1f µs CPU per recipient (server and services, %.2f cores busy)\n",
		r.e2eRate, float64(r.cpu.Microseconds())/float64(r.n), r.cpu.Seconds()/max(r.finalSeen.Seconds(), 1e-3))
	fmt.Printf("  enqueue-to-send latency: p50 %s p99 %s\n", r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond))
	fmt.Printf("  scheduling: runnable goroutines waited %s\n", r.sched)
	fmt.Printf("  peak RSS of this process (server + services): %.0f MB\n", r.peakRSSMB)
	if r.jobMessages > 0 {
		fmt.Printf("  jobs: %d messages on %s, %.1f recipients a message\n", r.jobMessages, contract.StreamJobs, float64(r.n)/float64(r.jobMessages))
		fmt.Printf("  health: %d values written to %s\n", r.healthWrites, contract.BucketHealth)
	}
	if r.sessions != "" {
		fmt.Printf("  dispatch: %s\n", r.sessions)
	}
}

// printTimeline prints how many sends there were in each span of width
// after the task's acceptance, by the sent events' stored times and by
// their send times (the events' at): a paced task's rate should hold flat
// from its ramp-up to its tail, and a dip in the first only shows that
// the events were stored late.
func (r *benchResult) printTimeline(width time.Duration) {
	for _, tl := range []struct {
		what string
		at   []time.Duration
	}{{"sent events stored", r.sends}, {"sends (the events' at)", r.sentAt}} {
		if len(tl.at) == 0 {
			continue
		}
		counts := make([]int, int(max(tl.at[len(tl.at)-1], 0)/width)+1)
		for _, d := range tl.at {
			counts[int(max(d, 0)/width)]++
		}
		var b strings.Builder
		for i, c := range counts {
			if i%8 == 0 {
				fmt.Fprintf(&b, "\n    %6.2fs", (time.Duration(i) * width).Seconds())
			}
			fmt.Fprintf(&b, " %6d", c)
		}
		fmt.Printf("  %s per %s after acceptance:%s\n", tl.what, width, b.String())
	}
}

// benchPipeline runs the four services (dispatch with `replicas` copies)
// and one task of n recipients over `accounts` accounts configured as
// account, with idleAccounts more of them the task does not name.
func benchPipeline(ctx context.Context, js jetstream.JetStream, n int, account string, accounts, idleAccounts, replicas int, o serviceOverrides, idle time.Duration) (*benchResult, error) {
	log, _ := shared.NewLogger(os.Stderr, shared.LogConfig{Format: os.Getenv("LOG_FORMAT"), Level: "error"})
	name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	var all []string
	for i := range accounts + idleAccounts {
		acct := fmt.Sprintf("%s-%d", name, i)
		if _, err := putAccountIfMissing(ctx, js, acct, account); err != nil {
			return nil, err
		}
		all = append(all, acct)
	}
	pool := all[:accounts]
	// The next run starts with none of these accounts: dispatch spreads all
	// the accounts it knows over its replicas.
	defer func() {
		if kv, err := js.KeyValue(context.WithoutCancel(ctx), contract.BucketAccounts); err == nil {
			for _, a := range all {
				_ = kv.Delete(context.WithoutCancel(ctx), a)
			}
		}
	}()
	svcCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	names := []string{"ingest", "render"}
	for range max(o.statusReplicas, 1) {
		names = append(names, "status")
	}
	for range replicas {
		names = append(names, "dispatch")
	}
	var svcErr atomic.Value
	// Render's own count says when it is done: with job groups JOBS
	// holds fewer messages than jobs.
	o.registry, o.renderRegistry = metrics.NewRegistry(), prometheus.NewRegistry()
	wg.Go(func() {
		if err := runServices(svcCtx, js, log, names, o); err != nil {
			svcErr.Store(err)
		}
	})
	defer func() { stop(); wg.Wait() }()

	id := name + "-task"
	task := contract.Task{ID: id, Channel: "sandbox", Accounts: pool, Template: "Hello {{.to}}, your code is {{.code}}",
		Defaults: map[string]any{"code": "BENCH"}}
	task.Recipients = make([]contract.Recipient, n)
	for i := range task.Recipients {
		task.Recipients[i] = contract.Recipient{To: fmt.Sprintf("+8613%09d", i)}
	}
	data, err := json.Marshal(task)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, contract.BucketProgress)
	if err != nil {
		return nil, err
	}
	// Measure the pipeline, not its start: submit once dispatch has made
	// every account's normal lane (in each account's first session; an
	// account without work then sleeps until the task wakes it) and a
	// status process folds.
	folds := make([]string, max(o.statusPartitions, 1))
	for k := range folds {
		folds[k] = status.FoldLeaseKey(k, len(folds))
	}
	if err := waitLeases(ctx, js, folds, 15*time.Second); err != nil {
		return nil, err
	}
	if err := waitSetUp(ctx, js, all, time.Minute+time.Duration(len(all))*20*time.Millisecond); err != nil {
		return nil, err
	}
	// Render makes its consumer once its views (the suppression list
	// among them) are loaded.
	if err := waitConsumers(ctx, js, contract.StreamRender, 1, time.Minute); err != nil {
		return nil, err
	}
	if v := svcErr.Load(); v != nil {
		return nil, v.(error)
	}
	if idle > 0 {
		// Accounts without work sleep (no lease, no pull request) once
		// their first session idles out: measure the pipeline at rest.
		asleep, err := waitAsleep(ctx, js, all, 60*time.Second)
		if err != nil {
			return nil, err
		}
		fmt.Printf("idle: every account asleep (lease released) %s after its first session\n", asleep.Round(time.Second))
		t0, c0 := time.Now(), cpuTime()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(idle):
		}
		consumers := 0
		if st, err := js.Stream(ctx, contract.StreamJobs); err == nil {
			consumers = st.CachedInfo().State.Consumers
		}
		fmt.Printf("idle: %d account(s) held, no task: %.3f cores (server and services) over %s, %d consumers on %s\n",
			len(all), (cpuTime()-c0).Seconds()/time.Since(t0).Seconds(), idle, consumers, contract.StreamJobs)
	}
	if line := pacingBound(pool, account, task.Recipients); line != "" {
		fmt.Println(line)
	}
	jobsSeq0, healthSeq0 := jobsLastSeq(ctx, js), lastSeq(ctx, js, healthStream)
	if o.taskProfile != nil {
		if err := pprof.StartCPUProfile(o.taskProfile); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	start, cpu0, sched0 := time.Now(), cpuTime(), readSchedLatencies()
	if _, err := client.Submit(ctx, js, data); err != nil {
		return nil, err
	}
	res := &benchResult{n: n, dispatchReplicas: replicas, accounts: accounts, idleAccounts: idleAccounts, statusReplicas: max(o.statusReplicas, 1), start: start}
	var lastP *contract.Progress
	polls := 0
	for {
		if v := svcErr.Load(); v != nil {
			return nil, v.(error)
		}
		// Render is done when it has rendered or skipped n jobs, asked
		// every fifth poll (a gather of render's own registry).
		if polls++; res.renderDone == 0 && polls%5 == 0 && renderedJobs(o.renderRegistry) >= n {
			res.renderDone = time.Since(start)
		}
		if e, err := kv.Get(ctx, id); err == nil {
			var p contract.Progress
			if json.Unmarshal(e.Value(), &p) == nil {
				lastP = &p
				if p.State.Final() {
					res.finalSeen = time.Since(start)
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	res.final = lastP
	res.sessions = sessionSummary(o.registry)
	res.jobMessages = jobsLastSeq(ctx, js) - jobsSeq0
	res.healthWrites = lastSeq(ctx, js, healthStream) - healthSeq0
	res.elapsed = lastP.FinishedAt.Sub(start)
	if lastP.StartedAt != nil {
		res.firstSend = lastP.StartedAt.Sub(start)
	}
	res.e2eRate = float64(lastP.Sent) / res.elapsed.Seconds()
	res.peakRSSMB = peakRSSMB()
	res.cpu = cpuTime() - cpu0
	res.sched = readSchedLatencies().since(sched0)
	if o.taskProfile != nil {
		pprof.StopCPUProfile()
	}
	var accepted time.Time
	res.sends, res.sentAt, accepted, res.firstSent, res.lastSent, err = sendLatencies(ctx, js, id)
	if len(res.sends) > 0 {
		res.p50, res.p99 = res.sends[len(res.sends)/2], res.sends[len(res.sends)*99/100]
	}
	res.ingestDone = accepted.Sub(start)
	if res.renderDone == 0 {
		res.renderDone = res.elapsed
	}
	return res, err
}

// jobsLastSeq is JOBS's last sequence, 0 when it cannot be read.
func jobsLastSeq(ctx context.Context, js jetstream.JetStream) uint64 {
	return lastSeq(ctx, js, contract.StreamJobs)
}

// lastSeq is stream's last sequence, 0 when it cannot be read.
func lastSeq(ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return 0
	}
	return st.CachedInfo().State.LastSeq
}

// healthStream is the stream behind KV broadcast_health.
const healthStream = "KV_" + contract.BucketHealth

// renderedJobs is how many jobs render has rendered or skipped, from
// render's metrics in reg.
func renderedJobs(reg *prometheus.Registry) int {
	families, err := reg.Gather()
	if err != nil {
		return 0
	}
	n := 0.0
	for _, f := range families {
		switch f.GetName() {
		case "broadcast_jobs_rendered_total", "broadcast_jobs_skipped_total":
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}

// sessionSummary says how dispatch's account sessions ended and how long
// its lease refreshes took, from the services' metrics in reg: a session
// that lost its lease hands its unacknowledged jobs back, and a refresh
// slower than 2.5 s lets the lease lapse (valid until 3.5 s after the last
// confirmed refresh began), stopping the account's sends.
func sessionSummary(reg *prometheus.Registry) string {
	families, err := reg.Gather()
	if err != nil {
		return ""
	}
	var ended []string
	var refreshes uint64
	var over map[float64]uint64
	for _, f := range families {
		switch f.GetName() {
		case "broadcast_account_sessions_ended_total":
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					ended = append(ended, fmt.Sprintf("%s %.0f", l.GetValue(), m.GetCounter().GetValue()))
				}
			}
		case "broadcast_lease_refresh_seconds":
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				refreshes = h.GetSampleCount()
				over = map[float64]uint64{}
				for _, b := range h.GetBucket() {
					over[b.GetUpperBound()] = refreshes - b.GetCumulativeCount()
				}
			}
		}
	}
	slices.Sort(ended)
	if len(ended) == 0 {
		ended = []string{"none"}
	}
	return fmt.Sprintf("account sessions ended: %s; lease refreshes %d, over 0.5 s %d, over 1 s %d, over 2.5 s %d",
		strings.Join(ended, ", "), refreshes, over[0.5], over[1], over[2.5])
}

// waitLeases waits until each of the leases (accounts' and the fold lease)
// is held.
func waitLeases(ctx context.Context, js jetstream.JetStream, accounts []string, timeout time.Duration) error {
	kv, err := js.KeyValue(ctx, contract.BucketLeases)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for _, a := range accounts {
		for {
			if _, err := kv.Get(ctx, a); err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("nobody took lease %s within %s", a, timeout)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// waitAsleep waits until none of accounts holds a lease (dispatch lets an
// account without work sleep) and says how long that took.
func waitAsleep(ctx context.Context, js jetstream.JetStream, accounts []string, timeout time.Duration) (time.Duration, error) {
	kv, err := js.KeyValue(ctx, contract.BucketLeases)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	for {
		held := 0
		for _, a := range accounts {
			if _, err := kv.Get(ctx, a); err == nil {
				held++
			}
		}
		if held == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("%d of %d accounts still hold a lease after %s", held, len(accounts), timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitConsumers waits until stream has at least n consumers: on JOBS the
// normal lanes of every account, which dispatch creates once it holds the
// account's lease; on RENDER render's, made once it is ready.
func waitConsumers(ctx context.Context, js jetstream.JetStream, stream string, n int, timeout time.Duration) error {
	start := time.Now()
	for {
		got := 0
		// The server may be too busy to answer in time (render and
		// dispatch loading a large suppression list): that is a wait too.
		if st, err := js.Stream(ctx, stream); err == nil {
			got = st.CachedInfo().State.Consumers
		} else if ctx.Err() != nil || time.Since(start) > timeout {
			return err
		}
		if got >= n {
			fmt.Printf("ready: %d consumer(s) on %s %s after the fold lease\n", got, stream, time.Since(start).Round(time.Millisecond))
			return nil
		} else if time.Since(start) > timeout {
			return fmt.Errorf("%s has %d of %d consumers after %s", stream, got, n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitSetUp waits until dispatch has set every account up: its normal
// lane's consumer exists (its first session runs) or, that session idled
// out, its asleep mark does.
func waitSetUp(ctx context.Context, js jetstream.JetStream, accounts []string, timeout time.Duration) error {
	start := time.Now()
	kv, err := js.KeyValue(ctx, contract.BucketLanes)
	if err != nil {
		return err
	}
	for {
		ready := map[string]bool{}
		if st, err := js.Stream(ctx, contract.StreamJobs); err == nil {
			names := st.ConsumerNames(ctx)
			for name := range names.Name() {
				ready[name] = true
			}
		}
		if keys, err := kv.ListKeys(ctx); err == nil {
			for k := range keys.Keys() {
				ready[contract.DispatchConsumer(k, contract.PriorityNormal)] = true
			}
		}
		got := 0
		for _, a := range accounts {
			if ready[contract.DispatchConsumer(a, contract.PriorityNormal)] {
				got++
			}
		}
		if got == len(accounts) {
			fmt.Printf("ready: %d account(s) set up (a normal lane or asleep) %s after the fold lease\n", got, time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("%d of %d accounts set up after %s", got, len(accounts), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sendLatencies reads the task's sent events and measures enqueue-to-send
// from the stored job enqueue time, approximated by the accepted event.
func sendLatencies(ctx context.Context, js jetstream.JetStream, taskID string) (lat, at []time.Duration, accepted, first, last time.Time, err error) {
	c, err := js.OrderedConsumer(ctx, contract.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{contract.SubjectEventsPrefix + taskID + ".>"}})
	if err != nil {
		return
	}
	info, err := c.Info(ctx)
	if err != nil {
		return
	}
	for read := uint64(0); read < info.NumPending; {
		b, ferr := c.Fetch(5000, jetstream.FetchMaxWait(2*time.Second))
		if ferr != nil {
			return nil, nil, accepted, first, last, ferr
		}
		got := 0
		for m := range b.Messages() {
			got++
			read++
			var ev contract.Event
			if json.Unmarshal(m.Data(), &ev) != nil {
				continue
			}
			switch ev.Kind {
			case contract.EventAccepted:
				accepted = ev.At
			case contract.EventSent:
				meta, merr := m.Metadata()
				if merr != nil {
					continue
				}
				if first.IsZero() || meta.Timestamp.Before(first) {
					first = meta.Timestamp
				}
				if meta.Timestamp.After(last) {
					last = meta.Timestamp
				}
				if !accepted.IsZero() {
					lat = append(lat, meta.Timestamp.Sub(accepted))
					at = append(at, ev.At.Sub(accepted))
				}
			}
		}
		if got == 0 {
			break
		}
	}
	slices.Sort(lat)
	slices.Sort(at)
	return lat, at, accepted, first, last, nil
}

// benchReplicas compares dispatch replica counts against a 20 ms provider
// with generous account rates. Each replica has an in-flight budget of
// replicaBudget provider calls (DISPATCH_MAX_IN_FLIGHT), standing for one
// machine's capacity, and the 8 accounts spread evenly over the replicas
// (share.go in dispatch): each account keeps one sender at a time, so
// replicas add throughput across accounts, not within one.
func benchReplicas(ctx context.Context, js jetstream.JetStream, list string) error {
	const replicaBudget = 16
	var base float64
	for _, f := range strings.Split(list, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 1 {
			return fmt.Errorf("replicas: %q is not a positive number", f)
		}
		res, err := benchPipeline(ctx, js, 8000*r, `{"channel":"sandbox","rate_per_sec":100000,"burst":1000,"concurrency":32,"latency":"20ms"}`, 8, 0, r,
			serviceOverrides{dispatch: func(c *dispatch.Config) { c.MaxInFlight = replicaBudget }}, 0)
		if err != nil {
			return err
		}
		res.providerLatencyStr = fmt.Sprintf(", 20 ms provider, %d calls in flight per replica", replicaBudget)
		res.print()
		if base == 0 {
			base = res.e2eRate / float64(r)
		}
		fmt.Printf("replicas=%d recipients_per_sec=%.0f per_replica=%.0f scaling=%.2f (1.00 is linear)\n",
			r, res.e2eRate, res.e2eRate/float64(r), res.e2eRate/(base*float64(r)))
	}
	return nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSSMB is this process's peak resident set size.
func peakRSSMB() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	if runtime.GOOS == "darwin" {
		return float64(ru.Maxrss) / (1 << 20)
	}
	return float64(ru.Maxrss) / 1024
}

// putBenchPolicy validates value and stores it as the default policy.
func putBenchPolicy(ctx context.Context, js jetstream.JetStream, value string) error {
	if _, err := contract.DecodePolicy([]byte(value)); err != nil {
		return fmt.Errorf("bench: -policy: %w", err)
	}
	kv, err := js.KeyValue(ctx, contract.BucketPolicy)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if _, err := kv.Put(ctx, contract.PolicyDefault, []byte(value)); err != nil {
		return fmt.Errorf("bench: put policy: %w", err)
	}
	return nil
}

// pacingBound says how fast the task can go at most when its accounts are
// paced: render picks each batch's accounts (shared.Balancer over batches
// of ingest.BatchSizeFor), so the busiest account, paced at its rate, sets
// the task's least time. It returns "" for unpaced accounts.
func pacingBound(pool []string, account string, rs []contract.Recipient) string {
	var accounts []*contract.Account
	for _, name := range pool {
		a, err := contract.DecodeAccount(name, []byte(account))
		if err != nil || a.RatePerSec >= contract.MaxRatePerSec {
			return ""
		}
		accounts = append(accounts, a)
	}
	configured := ingest.DefaultBatchSize
	if c, err := ingest.ConfigFromEnv(); err == nil && c.BatchSize > 0 {
		configured = c.BatchSize
	}
	size := ingest.BatchSizeFor(configured, len(pool))
	slack := 0
	if c, err := render.ConfigFromEnv(); err == nil {
		slack = c.AccountSlack
	}
	picker := shared.NewPicker(accounts, nil)
	count := map[string]int{}
	for first := 0; first < len(rs); first += size {
		batch := rs[first:min(first+size, len(rs))]
		b := picker.Balance(len(batch), slack)
		for _, r := range batch {
			count[b.Pick(r.To).Name]++
		}
	}
	busiest := 0
	for _, c := range count {
		busiest = max(busiest, c)
	}
	if busiest == 0 {
		return ""
	}
	a := accounts[0]
	least := float64(busiest-min(busiest, a.Burst)) / a.RatePerSec
	return fmt.Sprintf("pacing: the busiest of %d account(s) has %d of %d recipients; at %g/s it needs %.2fs at least, so %.0f recipients/s at most",
		len(pool), busiest, len(rs), a.RatePerSec, least, float64(len(rs))/max(least, 1e-3))
}
