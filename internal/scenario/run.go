package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// RunOptions tune Run.
type RunOptions struct {
	// Start starts the stack. Defaults to StartInProcess.
	Start StartFunc
	// Logf receives the runner's timeline. Defaults to none.
	Logf func(format string, args ...any)
	// Tapes, per webhook account name, are played by that account's fake
	// (gateway.Config.Tape). Defaults to none.
	Tapes map[string]*gateway.Tape
	// Slack is added to every task's time bound, for loaded machines.
	// Defaults to 0.
	Slack time.Duration
}

// Observation is everything a run saw: the fakes' ledgers, KV progress,
// events and dead letters, and when the runner did what.
type Observation struct {
	Scenario *Scenario
	Start    time.Time
	// Hits per account, from the fakes (none for sandbox accounts).
	Hits map[string][]Hit
	// Progress, Events and Dead per task.
	Progress map[string]*contract.Progress
	Events   map[string][]contract.Event
	Dead     map[string][]contract.DeadLetter
	// Submitted, Deadline and Final per task: when it was submitted, the
	// bound it had to be final by, and when it was seen final (zero if
	// never).
	Submitted map[string]time.Time
	Deadline  map[string]time.Time
	Final     map[string]time.Time
	// Submitting per task: when its submission started (Submitted is when
	// it was acknowledged).
	Submitting map[string]time.Time
	// SuppressedAt is when each of the scenario's Suppressions was put
	// (zero if it could not be).
	SuppressedAt []time.Time
	// Kills are the process faults as run.
	Kills []KillAt
	// Queued counts the messages left in stream JOBS per subject when the
	// run ended (jobs, delayed and parked ones): where a task that is not
	// final has its work.
	Queued map[string]uint64
	// Notes are what the runner did and what control requests answered.
	Notes []string
	// Stalls are the spans in which the runner's process, where the fakes
	// stamp requests, did not run (stall.go).
	Stalls []Stall
}

// KillAt is a kill as run.
type KillAt struct {
	At      time.Time
	Process string
}

// Secret is the token every account of the scenario is given, through the
// environment variable SecretEnv(account).
const Secret = "scenario-secret"

// SecretEnv names the variable holding account's token.
func SecretEnv(account string) string {
	return "BROADCAST_SECRET_SC_" + strings.ToUpper(strings.ReplaceAll(account, "-", "_"))
}

// Address is the recipient at index i of a channel's universe: valid ones,
// bad ones (the provider rejects them permanently) and test recipients.
func Address(channel string, i int, kind string) string {
	switch channel {
	case "wxpusher":
		return fmt.Sprintf("UID_%s%04d", kind, i)
	case "whatsapp":
		prefix := map[string]string{"r": "+86138", "bad": "+86139", "qa": "+86137"}[kind]
		return fmt.Sprintf("%s%08d", prefix, i)
	case "smtp":
		return fmt.Sprintf("%s%04d@shop.example", kind, i)
	}
	return fmt.Sprintf("%s-%04d", kind, i)
}

// invalidAddress is skipped by render (not an address of the channel).
func invalidAddress(channel string, i int) string {
	switch channel {
	case "whatsapp":
		return strconv.Itoa(1000 + i)
	case "smtp":
		return fmt.Sprintf("not an address %d", i)
	}
	return fmt.Sprintf("not-a-uid-%d", i)
}

// runner is one run's state.
type runner struct {
	sc    *Scenario
	o     RunOptions
	stack Stack
	nc    *nats.Conn
	js    jetstream.JetStream
	fakes map[string]Fake
	// accounts are the current account values, edited by actions.
	accounts map[string]map[string]any
	obs      *Observation
	probe    *stallProbe
	mu       sync.Mutex
}

// Run runs sc against a fresh stack and returns what it observed; Check
// judges it. An error means the run itself could not be done (a stack that
// did not start), not that the system misbehaved.
func Run(ctx context.Context, sc *Scenario, o RunOptions) (*Observation, error) {
	if o.Start == nil {
		o.Start = StartInProcess
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	r := &runner{sc: sc, o: o, fakes: map[string]Fake{}, accounts: map[string]map[string]any{}}
	r.obs = &Observation{Scenario: sc, Hits: map[string][]Hit{}, Progress: map[string]*contract.Progress{},
		Events: map[string][]contract.Event{}, Dead: map[string][]contract.DeadLetter{},
		Submitted: map[string]time.Time{}, Deadline: map[string]time.Time{}, Final: map[string]time.Time{},
		Submitting: map[string]time.Time{}, SuppressedAt: make([]time.Time, len(sc.Suppressions))}
	defer func() {
		for _, f := range r.fakes {
			f.Close()
		}
	}()
	r.probe = startStallProbe()
	defer r.probe.Stop()
	env := map[string]string{}
	for k, v := range DispatchEnv {
		env[k] = v
	}
	if sc.StatusPartitions > 1 {
		env["STATUS_PARTITIONS"] = strconv.Itoa(sc.StatusPartitions)
	}
	if sc.JobsPerMessage > 0 {
		env["RENDER_JOBS_PER_MESSAGE"] = strconv.Itoa(sc.JobsPerMessage)
	}
	if sc.SessionIdle > 0 {
		env["DISPATCH_SESSION_IDLE"] = sc.SessionIdle.String()
	}
	if sc.KeptConsumers != 0 {
		env["DISPATCH_KEPT_CONSUMERS"] = strconv.Itoa(sc.KeptConsumers)
	}
	if sc.Replicas > 1 {
		env[ReplicasEnv] = strconv.Itoa(sc.Replicas)
	}
	for _, p := range sc.Pools {
		for _, a := range p.Accounts {
			env[SecretEnv(a.Name)] = Secret
			if err := r.startFake(p.Channel, a); err != nil {
				return nil, err
			}
		}
	}
	stack, err := o.Start(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("start stack: %w", err)
	}
	r.stack = stack
	defer stack.Close()
	r.nc, err = nats.Connect(stack.URL(), nats.Name("scenario-runner"), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	defer r.nc.Close()
	if r.js, err = jetstream.New(r.nc); err != nil {
		return nil, err
	}
	for _, p := range sc.Pools {
		for _, a := range p.Accounts {
			if !a.AddedLater {
				if err := r.putAccount(ctx, a.Name); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := r.putPolicy(ctx); err != nil {
		return nil, err
	}
	for i, e := range sc.Suppressions {
		if e.Early {
			if err := r.suppress(ctx, i); err != nil {
				return nil, err
			}
		}
	}
	// Let dispatch start the accounts, and the services' views take the
	// policy and the suppression list, before the first task.
	time.Sleep(300 * time.Millisecond)
	if err := r.timeline(ctx); err != nil {
		return nil, err
	}
	// Late answers land and status flushes.
	time.Sleep(1500 * time.Millisecond)
	return r.collect(ctx)
}

func (r *runner) note(format string, args ...any) {
	msg := fmt.Sprintf("%6.2fs ", time.Since(r.obs.Start).Seconds()) + fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.obs.Notes = append(r.obs.Notes, msg)
	r.mu.Unlock()
	r.o.Logf("%s", msg)
}

func (r *runner) startFake(channel string, a Account) error {
	seed := r.sc.Seed ^ uint64(len(r.fakes)+1)*0x9e3779b97f4a7c15
	var f Fake
	switch channel {
	case "webhook":
		w, err := newWebhookFake(seed, a, r.o.Tapes[a.Name])
		if err != nil {
			return err
		}
		f = w
	case "wxpusher":
		f = newWxPusherFake(seed, a, Secret)
	case "whatsapp":
		f = newWhatsAppFake(seed, a, Secret, phoneID(a.Name))
	case "smtp":
		s, err := newSMTPFake(seed, a)
		if err != nil {
			return err
		}
		f = s
	case "sandbox":
	default:
		return fmt.Errorf("scenario: no fake for channel %q", channel)
	}
	if f != nil {
		r.fakes[a.Name] = f
	}
	r.accounts[a.Name] = accountValue(channel, a, f)
	return nil
}

func phoneID(account string) string {
	var n int
	for _, c := range account {
		n = n*31 + int(c)
	}
	return strconv.Itoa(100000 + n%900000)
}

// accountValue is the account's KV value.
func accountValue(channel string, a Account, f Fake) map[string]any {
	v := map[string]any{
		"channel":      channel,
		"rate_per_sec": a.RatePerSec,
		"burst":        a.Burst,
		"concurrency":  a.Concurrency,
	}
	if a.MinRatePerSec > 0 {
		v["min_rate_per_sec"] = a.MinRatePerSec
	}
	if a.DailyCap > 0 {
		v["daily_cap"] = a.DailyCap
	}
	if a.PerRecipientInterval > 0 {
		v["per_recipient_interval"] = a.PerRecipientInterval.String()
	}
	if a.MaxBatch > 0 {
		v["max_batch"] = a.MaxBatch
	}
	if a.Timeout > 0 && channel != "sandbox" {
		v["timeout"] = a.Timeout.String()
	}
	switch channel {
	case "webhook":
		v["endpoint"] = f.URL()
	case "sandbox":
		v["fail_rate"] = a.Faults.FailRate
		v["rate_limited_rate"] = a.Faults.RateLimitedRate
		v["permanent_prefix"] = "bad-"
		if a.Faults.Latency > 0 {
			v["latency"] = a.Faults.Latency.String()
		}
	case "wxpusher":
		v["endpoint"], v["secret_env"] = f.URL(), SecretEnv(a.Name)
	case "whatsapp":
		v["endpoint"], v["secret_env"], v["phone_number_id"] = f.URL(), SecretEnv(a.Name), phoneID(a.Name)
	case "smtp":
		host, port, _ := net.SplitHostPort(f.URL())
		p, _ := strconv.Atoi(port)
		v["host"], v["port"], v["tls"] = host, p, "none"
		v["from"], v["subject"] = "Shop <noreply@shop.example>", "News"
		if a.Connections > 0 {
			v["connections"] = a.Connections
		}
	}
	return v
}

func (r *runner) putAccount(ctx context.Context, name string) error {
	data, err := json.Marshal(r.accounts[name])
	if err != nil {
		return err
	}
	kv, err := r.js.KeyValue(ctx, contract.BucketAccounts)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, name, data)
	return err
}

func (r *runner) deleteAccount(ctx context.Context, name string) error {
	kv, err := r.js.KeyValue(ctx, contract.BucketAccounts)
	if err != nil {
		return err
	}
	return kv.Delete(ctx, name)
}

// putPolicy stores the scenario's recipient policy under key default.
func (r *runner) putPolicy(ctx context.Context) error {
	if r.sc.FrequencyCap <= 0 {
		return nil
	}
	kv, err := r.js.KeyValue(ctx, contract.BucketPolicy)
	if err != nil {
		return err
	}
	v := fmt.Sprintf(`{"frequency_caps":[{"category":"marketing","max":%d,"window":"24h"}]}`, r.sc.FrequencyCap)
	if _, err := contract.DecodePolicy([]byte(v)); err != nil {
		return err
	}
	_, err = kv.Put(ctx, contract.PolicyDefault, []byte(v))
	r.o.Logf("policy default %s: %v", v, errText(err))
	return err
}

// suppress puts the scenario's suppression entry i and records when.
func (r *runner) suppress(ctx context.Context, i int) error {
	e := r.sc.Suppressions[i]
	l, err := suppress.Open(ctx, r.js)
	if err != nil {
		return err
	}
	entry := contract.Suppression{To: Address(e.Channel, e.Index, "r"), Reason: contract.ReasonManual, Source: "scenario"}
	for _, c := range e.Categories {
		entry.Categories = append(entry.Categories, contract.Category(c))
	}
	if _, err := l.Put(ctx, e.Scope, entry); err != nil {
		return err
	}
	r.mu.Lock()
	r.obs.SuppressedAt[i] = time.Now()
	r.mu.Unlock()
	if r.obs.Start.IsZero() {
		r.o.Logf("suppress %s in %s %v", entry.To, e.Scope, e.Categories)
	} else {
		r.note("suppress %s in %s %v", entry.To, e.Scope, e.Categories)
	}
	return nil
}

// taskJSON is the task as submitted.
func (r *runner) taskJSON(ctx context.Context, t Task) ([]byte, error) {
	task := map[string]any{
		"id":       t.ID,
		"channel":  t.Channel,
		"defaults": map[string]any{"task": t.ID},
	}
	if t.Batchable {
		task["template"] = "[{{.task}}] News {{.v}}"
	} else {
		task["template"] = "[{{.task}}] Hello {{.to}}"
	}
	var rows []contract.Recipient
	add := func(to string, i int) {
		rows = append(rows, contract.Recipient{To: to, Vars: map[string]any{"v": []string{"A", "B"}[i%2]}})
	}
	for _, i := range t.Recipients {
		add(Address(t.Channel, i, "r"), i)
	}
	for _, i := range t.Bad {
		add(Address(t.Channel, i, "bad"), i)
	}
	for i := range t.Invalid {
		add(invalidAddress(t.Channel, i), i)
	}
	for i := range t.Repeats {
		rows = append(rows, rows[(i*7)%len(rows)])
	}
	if t.Object {
		var buf bytes.Buffer
		for _, row := range rows {
			b, _ := json.Marshal(row)
			buf.Write(b)
			buf.WriteByte('\n')
		}
		os, err := r.js.ObjectStore(ctx, contract.BucketRecipients)
		if err != nil {
			return nil, err
		}
		name := "lists/" + t.ID + ".jsonl"
		if _, err := os.PutBytes(ctx, name, buf.Bytes()); err != nil {
			return nil, fmt.Errorf("object %s: %w", name, err)
		}
		task["recipients_object"] = name
	} else {
		task["recipients"] = rows
	}
	if len(t.Accounts) > 0 {
		task["accounts"] = t.Accounts
	}
	if t.Priority != "" {
		task["priority"] = t.Priority
	}
	now := time.Now()
	if t.SendAfter > 0 {
		task["send_at"] = now.Add(t.SendAfter).UTC().Format(time.RFC3339Nano)
	}
	if t.ExpiresIn > 0 {
		task["expires_at"] = now.Add(t.ExpiresIn).UTC().Format(time.RFC3339Nano)
	}
	if t.MaxAttempts > 0 {
		task["max_attempts"] = t.MaxAttempts
	}
	if t.Category != "" {
		task["category"] = t.Category
	}
	if t.DigestKey != "" {
		task["digest_key"], task["digest_window"] = t.DigestKey, t.DigestWindow.String()
	}
	var tests []contract.Recipient
	for i := range t.Tests {
		tests = append(tests, contract.Recipient{To: Address(t.Channel, i, "qa")})
	}
	if len(tests) > 0 {
		task["test_recipients"] = tests
	}
	return json.Marshal(task)
}

// Bound is how long t may take to be final from its submission: its
// delays plus three times the time its slowest account takes for its
// share of the pool's recipients (for retries and slow-downs) plus a fixed
// allowance for retries, Retry-After waits and moves off a failing
// account, at most MaxBound (or half again the slowest account's time,
// up to MaxFloorBound, when that is more), plus its pauses.
func Bound(sc *Scenario, t Task) time.Duration {
	p := sc.Pool(t.Channel)
	var rates []float64
	allAlong := 0
	for _, a := range p.Accounts {
		if a.Faults.Unauthorized || (len(t.Accounts) > 0 && !slices.Contains(t.Accounts, a.Name)) {
			continue
		}
		// An account disabled or removed during the run hands its queue to
		// the others for good (moved work does not come back when it is
		// enabled again): its pace does not count.
		if slices.ContainsFunc(sc.Actions, func(x Action) bool {
			return x.Account == a.Name && (x.Kind == ActRemove || x.Enabled != nil && !*x.Enabled)
		}) {
			continue
		}
		// One added later starts late, but render gives it its share of
		// what it renders after, and moves give it work too: a slow one
		// sets the pace as one there all along does (seed 13250440: an
		// account added at 0.95 s, its provider taking 4/s, held 41 jobs
		// at the bound while the pool's 97/s account had none). Only the
		// accounts there all along give the floor below.
		if !a.AddedLater {
			allAlong++
		}
		// The slowest rate the account has during the run (an edit may
		// lower it: seed 328788424); calls carry several recipients only
		// when the texts are identical (seed 766943860).
		ar := a.RatePerSec
		for _, x := range sc.Actions {
			if x.Account == a.Name && x.Kind == ActEdit && x.RatePerSec > 0 {
				ar = math.Min(ar, x.RatePerSec)
			}
		}
		if a.MaxBatch > 1 && t.Batchable {
			ar *= float64(a.MaxBatch) / 4
		}
		if c := a.Faults.CapacityPerSec; c > 0 {
			ar = math.Min(ar, c)
		}
		// Each random 429 stops the account for the gateway's Retry-After
		// (1 s), which dispatch honours.
		ar = 1 / (1/ar + a.Faults.RateLimitedRate*time.Second.Seconds())
		rates = append(rates, math.Max(ar, 0.5))
	}
	// Without an account that can send for the whole run (all 401, or
	// all disabled at some point) the task's pace is not the pool's: no
	// floor then.
	floor := allAlong > 0
	if len(rates) == 0 {
		rates = []float64{1}
	}
	// The pool's other tasks share its rate (and a higher priority goes
	// first), so count all of them.
	n := 0.0
	for _, o := range sc.Tasks {
		if o.Channel == t.Channel {
			n += float64(len(o.Recipients) + len(o.Bad) + o.Invalid)
		}
	}
	// Render spreads recipients over the accounts and work stays where it
	// was put (it moves only off an unhealthy account), so the slowest
	// account's share, a fifth more than even, sets the pace (seed
	// 328788424: a third of the task at 3/s next to accounts at 70/s).
	slowest := 0.0
	for _, r := range rates {
		slowest = math.Max(slowest, 1.2*n/float64(len(rates))/r)
	}
	d := t.SendAfter + t.Approve + time.Duration(3*slowest*float64(time.Second)) + 12*time.Second
	if t.DigestWindow > 0 {
		// An item waits for its digest's window, and one that finds the
		// digest full or being sent a second more to open the next.
		d += 2*t.DigestWindow + time.Second
	}
	// A scenario is drawn for seconds of sending; two minutes are far past
	// what most of them need (a rate edited down to 12/s gave 2m44s; 250
	// recipients pinned to one account at 9/s refusing 4.8 % with
	// Retry-After took 70 s: seed 593585011). Not less, though, than half
	// again the slowest account's own time for its share, up to
	// MaxFloorBound: a pool whose only account there all along answers 429
	// above 3/s needs about 3 minutes for 511 recipients (seed 715504403).
	limit := MaxBound
	if floor {
		limit = min(max(MaxBound, t.SendAfter+t.Approve+time.Duration(1.5*slowest*float64(time.Second))+12*time.Second), MaxFloorBound)
	}
	d = min(d, limit)
	for _, a := range sc.Actions {
		if a.Task == t.ID && a.Kind == ActPause {
			d += resumeAfter(sc, a) + time.Second
		}
	}
	return d
}

// MaxBound caps Bound before pauses are added, unless the pool's slowest
// account needs more; MaxFloorBound caps it then.
const (
	MaxBound      = 2 * time.Minute
	MaxFloorBound = 6 * time.Minute
)

// resumeAfter is how long the task of pause action a stays paused.
func resumeAfter(sc *Scenario, a Action) time.Duration {
	for _, b := range sc.Actions {
		if b.Task == a.Task && b.Kind == ActResume && b.At >= a.At {
			return b.At - a.At
		}
	}
	return 0
}

type event struct {
	at  time.Duration
	run func()
}

// timeline submits the tasks and runs the actions at their moments, then
// waits until every task is final or past its bound.
func (r *runner) timeline(ctx context.Context) error {
	r.obs.Start = time.Now()
	var evs []event
	var wg sync.WaitGroup
	for _, t := range r.sc.Tasks {
		evs = append(evs, event{t.At, func() {
			data, err := r.taskJSON(ctx, t)
			if err != nil {
				r.note("task %s not built: %v", t.ID, err)
				return
			}
			r.mu.Lock()
			r.obs.Submitting[t.ID] = time.Now()
			r.mu.Unlock()
			if _, err := client.Submit(ctx, r.js, data); err != nil {
				r.note("task %s not submitted: %v", t.ID, err)
				return
			}
			now := time.Now()
			r.mu.Lock()
			r.obs.Submitted[t.ID] = now
			r.obs.Deadline[t.ID] = now.Add(Bound(r.sc, t) + r.o.Slack)
			r.mu.Unlock()
			r.note("submitted %s (%d recipients)", t.ID, len(t.Recipients)+len(t.Bad)+t.Invalid)
			if t.Tests > 0 {
				wg.Go(func() { r.approve(ctx, t) })
			}
		}})
	}
	for _, a := range r.sc.Actions {
		evs = append(evs, event{a.At, func() {
			if a.Kind == ActRetryDead {
				wg.Go(func() { r.retryDead(ctx, a.Task) })
				return
			}
			r.act(ctx, a)
		}})
	}
	for i, e := range r.sc.Suppressions {
		if !e.Early {
			evs = append(evs, event{e.At, func() {
				if err := r.suppress(ctx, i); err != nil {
					r.note("suppress %d: %v", i, err)
				}
			}})
		}
	}
	for _, k := range r.sc.Kills {
		evs = append(evs, event{k.At, func() {
			r.mu.Lock()
			r.obs.Kills = append(r.obs.Kills, KillAt{At: time.Now(), Process: k.Target()})
			r.mu.Unlock()
			err := r.stack.Kill(k.Target())
			r.note("kill -9 %s: %v", k.Target(), err)
		}})
	}
	slices.SortStableFunc(evs, func(a, b event) int { return int(a.at - b.at) })
	for _, e := range evs {
		if d := time.Until(r.obs.Start.Add(e.at)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		e.run()
	}
	wg.Wait()
	return r.waitFinal(ctx)
}

// act runs one operator action.
func (r *runner) act(ctx context.Context, a Action) {
	switch a.Kind {
	case ActPause, ActResume, ActCancel:
		rep, err := r.control(ctx, a.Task, a.Kind)
		r.note("%s %s: %v %v", a.Kind, a.Task, replyState(rep), errText(err))
	case ActEdit:
		v := r.accounts[a.Account]
		if a.RatePerSec > 0 {
			v["rate_per_sec"] = a.RatePerSec
			if m, ok := v["min_rate_per_sec"].(float64); ok && m > a.RatePerSec {
				v["min_rate_per_sec"] = a.RatePerSec
			}
		}
		if a.DailyCap != nil {
			v["daily_cap"] = *a.DailyCap
		}
		if a.Enabled != nil {
			v["enabled"] = *a.Enabled
		}
		err := r.putAccount(ctx, a.Account)
		r.note("edit %s %s: %v", a.Account, editText(a), errText(err))
	case ActAdd:
		err := r.putAccount(ctx, a.Account)
		r.note("add %s: %v", a.Account, errText(err))
	case ActRemove:
		err := r.deleteAccount(ctx, a.Account)
		r.note("remove %s: %v", a.Account, errText(err))
	case ActRepeat:
		n, err := r.repeatJobs(ctx, a.Task)
		r.note("repeat %s: %d jobs published again, %v", a.Task, n, errText(err))
	}
}

// maxRepeats is how many jobs an ActRepeat publishes again at least,
// when that many are queued (the jobs of the message that reaches it all
// go, so a few more).
const maxRepeats = 40

// repeatJobs publishes again, alone, checked (Job.Recheck) and without a
// Nats-Msg-Id, about maxRepeats of the task's jobs still queued on their
// lanes, as render does for a batch rendered again once JOBS's duplicate
// window forgot it. Every recipient must still be sent once.
func (r *runner) repeatJobs(ctx context.Context, task string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := r.js.Stream(ctx, contract.StreamJobs)
	if err != nil {
		return 0, err
	}
	st := stream.CachedInfo().State
	n := 0
	// The last queued first: the repeats follow them closely, so both
	// messages of a job can be delivered before either is sent.
	for seq := st.LastSeq; seq >= st.FirstSeq && seq > 0 && seq+5000 > st.LastSeq && n < maxRepeats; seq-- {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			continue // acknowledged since, or never a job
		}
		if m.Header.Get(contract.HeaderCopyOf) != "" || m.Header.Get("Nats-Schedule") != "" {
			continue // a copy or a schedule: render publishes neither
		}
		for _, line := range contract.SplitJobs(m.Data) {
			var j contract.Job
			if contract.DecodeJob(line, &j) != nil || j.TaskID != task || m.Subject != contract.JobSubject(j.Account, j.Priority) {
				continue
			}
			j.Recheck = true
			data, err := contract.EncodeJob(&j)
			if err != nil {
				return n, err
			}
			if _, err := r.js.Publish(ctx, m.Subject, data); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

func editText(a Action) string {
	var parts []string
	if a.RatePerSec > 0 {
		parts = append(parts, fmt.Sprintf("rate_per_sec=%v", a.RatePerSec))
	}
	if a.DailyCap != nil {
		parts = append(parts, fmt.Sprintf("daily_cap=%d", *a.DailyCap))
	}
	if a.Enabled != nil {
		parts = append(parts, fmt.Sprintf("enabled=%v", *a.Enabled))
	}
	return strings.Join(parts, " ")
}

func replyState(rep *contract.ControlReply) string {
	if rep == nil {
		return "-"
	}
	return string(rep.State)
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func (r *runner) control(ctx context.Context, task, action string) (*contract.ControlReply, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return client.Control(cctx, r.nc, task, action)
}

// approve resumes a task with test recipients once it awaits approval,
// asking again while the request fails, for at most 15 s.
func (r *runner) approve(ctx context.Context, t Task) {
	time.Sleep(t.Approve)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if p := r.progress(ctx, t.ID); p != nil {
			if p.State == contract.StateAwaitingApproval {
				rep, err := r.control(ctx, t.ID, ActResume)
				r.note("approve %s: %v %v", t.ID, replyState(rep), errText(err))
				if err == nil {
					return
				}
				// As a user would: again, while ingest (which answers
				// control requests) is back from a kill (seed 167613659).
			}
			if p.State.Final() {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.note("approve %s: never awaited approval", t.ID)
}

// retryDead waits for a task to be final, then re-queues its dead letters.
func (r *runner) retryDead(ctx context.Context, task string) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		dl, ok := r.obs.Deadline[task]
		r.mu.Unlock()
		if ok {
			deadline = dl
		}
		if p := r.progress(ctx, task); p != nil && p.State.Final() {
			if p.Failed == 0 || p.State == contract.StateCancelled {
				return
			}
			rep, err := r.control(ctx, task, ActRetryDead)
			n := 0
			if rep != nil {
				n = rep.Requeued
			}
			r.note("retry-dead %s: %d requeued, %v", task, n, errText(err))
			if err == nil {
				// The task must be final again within a fresh bound.
				r.mu.Lock()
				r.obs.Deadline[task] = time.Now().Add(Bound(r.sc, Task{Channel: r.taskOf(task).Channel, Recipients: make([]int, n)}) + r.o.Slack)
				r.mu.Unlock()
				time.Sleep(500 * time.Millisecond)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *runner) taskOf(id string) Task {
	for _, t := range r.sc.Tasks {
		if t.ID == id {
			return t
		}
	}
	return Task{}
}

func (r *runner) progress(ctx context.Context, task string) *contract.Progress {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	p, err := client.Get(cctx, r.js, task)
	if err != nil {
		return nil
	}
	return p
}

// waitFinal polls every submitted task until it is final or past its
// bound; a task must also stay final for a moment (a retry-dead re-opens
// it).
func (r *runner) waitFinal(ctx context.Context) error {
	for {
		pending := 0
		r.mu.Lock()
		ids := make([]string, 0, len(r.obs.Submitted))
		for id := range r.obs.Submitted {
			ids = append(ids, id)
		}
		r.mu.Unlock()
		for _, id := range ids {
			p := r.progress(ctx, id)
			r.mu.Lock()
			if p != nil && p.State.Final() {
				if r.obs.Final[id].IsZero() {
					r.obs.Final[id] = time.Now()
				}
			} else {
				r.obs.Final[id] = time.Time{}
				if time.Now().Before(r.obs.Deadline[id]) {
					pending++
				}
			}
			r.mu.Unlock()
		}
		if pending == 0 {
			return nil
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// collect reads the fakes' ledgers, progress, events and dead letters.
func (r *runner) collect(ctx context.Context) (*Observation, error) {
	// The fakes last, so that they hold at least every send an event
	// reports (a task not final is still sending).
	defer func() {
		for name, f := range r.fakes {
			r.obs.Hits[name] = f.Hits()
		}
		r.obs.Stalls = r.probe.Stop()
	}()
	if st, err := r.js.Stream(ctx, contract.StreamJobs); err == nil {
		if info, err := st.Info(ctx, jetstream.WithSubjectFilter("broadcast.>")); err == nil {
			r.obs.Queued = info.State.Subjects
		}
	}
	for _, t := range r.sc.Tasks {
		if _, ok := r.obs.Submitted[t.ID]; !ok {
			continue
		}
		r.obs.Progress[t.ID] = r.progress(ctx, t.ID)
		evs, err := ReadEvents(ctx, r.js, t.ID)
		if err != nil {
			return nil, err
		}
		r.obs.Events[t.ID] = evs
		dead, err := ReadDead(ctx, r.js, t.ID)
		if err != nil {
			return nil, err
		}
		r.obs.Dead[t.ID] = dead
	}
	return r.obs, nil
}

// ReadEvents returns a task's events in stream order.
func ReadEvents(ctx context.Context, js jetstream.JetStream, task string) ([]contract.Event, error) {
	var out []contract.Event
	err := readStream(ctx, js, contract.StreamEvents, contract.SubjectEventsPrefix+task+".>", func(data []byte) error {
		var ev contract.Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return err
		}
		out = append(out, ev)
		return nil
	})
	return out, err
}

// ReadDead returns a task's dead letters in stream order.
func ReadDead(ctx context.Context, js jetstream.JetStream, task string) ([]contract.DeadLetter, error) {
	var out []contract.DeadLetter
	err := readStream(ctx, js, contract.StreamDead, contract.DeadSubject(task), func(data []byte) error {
		var d contract.DeadLetter
		if err := json.Unmarshal(data, &d); err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
	return out, err
}

func readStream(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func([]byte) error) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(cctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return fmt.Errorf("%s %s: %w", stream, filter, err)
	}
	info, err := c.Info(cctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", stream, filter, err)
	}
	for n := uint64(0); n < info.NumPending; {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			if err := fn(m.Data()); err != nil {
				return err
			}
			got++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if got == 0 {
			return fmt.Errorf("%s %s: %d of %d messages read", stream, filter, n, info.NumPending)
		}
		n += uint64(got)
	}
	return nil
}
