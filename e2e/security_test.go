package e2e

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/e2e/harness"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/logtest"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// TestLeastPrivilegePipeline runs the four services under their own users
// from auth.conf (which nats.conf includes), after each has connected the
// way a service starts (shared.ConnectService: the topology, created by
// admin, only checked; no service user may create or change a stream),
// with the operator (the test's client) submitting, configuring and
// controlling, through every flow: a broadcast with
// retries, rate limits and permanent failures; retry-dead (dispatch
// re-queues the dead letters ingest asks for); pause and resume (dispatch
// parks jobs, and re-queues them on resume); and a recipient list uploaded
// to the object store. The server must log no permission violation.
func TestLeastPrivilegePipeline(t *testing.T) {
	t.Parallel()
	cs, users, _ := startSecureServer(t, natstest.ConfigOptions{})
	gw := harness.StartGateway(t, gateway.Config{FailRate: 0.05, RateLimitedRate: 0.03, RetryAfter: time.Second, PermanentPrefix: "bad-", Seed: 5})
	cs.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":300,"burst":20,"concurrency":8}`, gw.URL))
	for _, name := range serviceNames {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		nc, _, err := shared.ConnectService(ctx, shared.NATSConfig{URL: cs.URL, User: users[name].User, Password: users[name].Password}, name, logtest.Logger())
		cancel()
		require.NoError(t, err, "%s starts against the topology admin created", name)
		nc.Close()
	}
	// Render and dispatch load the suppression list at start, as their
	// own users, through a pulled snapshot: one entry makes them read it.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	sl, err := suppress.Open(sctx, cs.Server.JS)
	require.NoError(t, err)
	_, err = sl.Put(sctx, contract.ScopeAll, contract.Suppression{To: "u-001", Reason: contract.ReasonManual, Source: "test"})
	scancel()
	require.NoError(t, err)
	cfg := harness.FastRetries()
	cfg.Users = users
	pipelinetest.StartPipeline(t, cs.Server, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			for _, v := range uniqueViolations(cs.Log.Violations()) {
				t.Log(v)
			}
		}
	})

	start := time.Now()
	stage := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	// 1. A broadcast with faults.
	task := contract.Task{ID: "lp-1", Channel: "webhook", Template: "Hi {{.to}}", MaxAttempts: 10}
	const n, bad = 300, 6
	for i := range n {
		to := fmt.Sprintf("u-%03d", i)
		if i%50 == 7 {
			to = fmt.Sprintf("bad-%03d", i)
		}
		task.Recipients = append(task.Recipients, contract.Recipient{To: to})
	}
	submitAsOperator(t, cs.Server, task)
	p := cs.WaitFinal(t, task.ID, 60*time.Second)
	t.Logf("lp-1: %s total=%d sent=%d failed=%d", p.State, p.Total, p.Sent, p.Failed)
	require.Equal(t, contract.StatePartial, p.State)
	require.Equal(t, n-bad-1, p.Sent)
	require.Equal(t, bad, p.Failed)
	require.Equal(t, 1, p.Skipped, "u-001 is on the suppression list")
	require.Equal(t, n-bad-1, gw.Ledger().AcceptedKeys())

	stage("lp-1 final")
	// 2. Retry-dead: dispatch reads DEAD and re-queues; the bad ones fail again.
	require.Len(t, harness.DeadLetters(t, cs.Server, task.ID), bad, "dead letters of lp-1")
	r := harness.Control(t, cs.Server, task.ID, contract.ActionRetryDead)
	require.Equal(t, bad, r.Requeued)
	natstest.Eventually(t, 30*time.Second, func() bool { return gw.Ledger().Injected["400"] == 2*bad }, "re-queued dead letters tried again")
	p = cs.WaitFinal(t, task.ID, 30*time.Second)
	require.Equal(t, bad, p.Failed)

	stage("retry-dead done")
	// 3. Pause and resume: parked jobs come back.
	slow := contract.Task{ID: "lp-2", Channel: "webhook", Template: "Hi {{.to}}", Recipients: pipelinetest.Recipients("p", 400)}
	cs.PutAccount(t, "hook", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":100,"burst":5,"concurrency":8,"min_rate_per_sec":80}`, gw.URL))
	before := gw.Ledger().AcceptedKeys()
	submitAsOperator(t, cs.Server, slow)
	natstest.Eventually(t, 30*time.Second, func() bool { return gw.Ledger().AcceptedKeys() >= before+50 })
	stage("lp-2 sending")
	harness.Control(t, cs.Server, slow.ID, contract.ActionPause)
	cs.Server.WaitProgress(t, slow.ID, 5*time.Second, func(p *contract.Progress) bool { return p.State == contract.StatePaused })
	time.Sleep(1500 * time.Millisecond) // jobs get parked
	stage("lp-2 paused")
	harness.Control(t, cs.Server, slow.ID, contract.ActionResume)
	stage("lp-2 resumed")
	p = cs.WaitFinal(t, slow.ID, 60*time.Second)
	t.Logf("lp-2 after pause/resume: %s sent=%d", p.State, p.Sent)
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 400, p.Sent)
	require.Equal(t, before+400, gw.Ledger().AcceptedKeys())
	require.Zero(t, gw.Ledger().Duplicates)

	// 4. A recipient list the operator uploads to the object store, which
	// ingest streams.
	var list strings.Builder
	list.WriteString("to,name\n")
	for i := range 50 {
		fmt.Fprintf(&list, "o-%02d,N%d\n", i, i)
	}
	harness.PutObject(t, cs.Server, "lists/lp.csv", list.String())
	before = gw.Ledger().AcceptedKeys()
	submitAsOperator(t, cs.Server, contract.Task{ID: "lp-3", Channel: "webhook", Template: "Hi {{.name}}", RecipientsObject: "lists/lp.csv"})
	p = cs.WaitFinal(t, "lp-3", 30*time.Second)
	stage("lp-3 (object list) final")
	require.Equal(t, contract.StateSucceeded, p.State)
	require.Equal(t, 50, p.Sent)
	require.Equal(t, before+50, gw.Ledger().AcceptedKeys())

	require.Empty(t, cs.Log.Violations(), "permission violations while the pipeline ran")
}

// uniqueViolations drops repeats, with random consumer names, inboxes and
// connection details blanked so that one missing grant shows once.
func uniqueViolations(lines []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, l := range lines {
		if i := strings.Index(l, " - "); i >= 0 {
			l = l[i+3:]
		}
		k := randomToken.ReplaceAllStringFunc(l, func(tok string) string {
			if strings.ToUpper(tok) == tok && !strings.ContainsAny(tok, "0123456789") {
				return tok // an API word such as CONSUMER
			}
			return "*"
		})
		k = inbox.ReplaceAllString(k, "_INBOX.*")
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

var (
	randomToken = regexp.MustCompile(`cid:\d+|\b[A-Za-z0-9]{8}\b`)
	inbox       = regexp.MustCompile(`_INBOX\.[A-Za-z0-9.*]+`)
)

// permCheck is one publish or subscribe a user attempts.
type permCheck struct {
	user, subject string
	allowed       bool
}

// TestLeastPrivilegeDenials connects as each user of auth.conf (credentials
// from the Procfile and .env) and attempts publishes and subscriptions:
// every denial must come back as a permissions violation naming the
// subject, and a few grants are checked to be grants, so a typo in a deny
// list cannot pass for a denial. No anonymous client and no wrong password
// gets in.
func TestLeastPrivilegeDenials(t *testing.T) {
	t.Parallel()
	cs, users, op := startSecureServer(t, natstest.ConfigOptions{})
	users["operator"] = op
	users["viewer"] = natstest.Credentials{User: "viewer", Password: viewerDevPassword}
	users["admin"] = users["setup"]
	delete(users, "setup")

	publishes := []permCheck{
		// Required by the issue.
		{"ingest", "broadcast.jobs.hook.normal", false},
		{"dispatch", "broadcast.tasks", false},
		{"operator", "broadcast.jobs.hook.normal", false},
		{"operator", "broadcast.events.t1.sent", false},
		// Each service only its own outputs.
		{"ingest", "broadcast.tasks", false},
		{"ingest", "broadcast.dead.t1", false},
		{"ingest", "broadcast.delay.hook.t1.0", false},
		{"ingest", "broadcast.parked.t1.hook", false},
		{"ingest", "$KV.broadcast_ledger.t1.0", false},
		{"render", "broadcast.tasks", false},
		{"render", "broadcast.control.t1", false},
		{"render", "$KV.broadcast_progress.t1", false},
		{"dispatch", "broadcast.render.t1", false},
		{"dispatch", "broadcast.control.t1", false},
		{"dispatch", "broadcast.start.t1", false},
		{"dispatch", "$KV.broadcast_progress.t1", false},
		{"dispatch", "$KV.broadcast_accounts.hook", false},
		{"status", "broadcast.jobs.hook.normal", false},
		{"status", "broadcast.events.t1.sent", false},
		{"status", "broadcast.tasks", false},
		{"status", "$KV.broadcast_ledger.t1.0", false},
		// The operator submits and configures, nothing else.
		{"operator", "broadcast.dead.t1", false},
		{"operator", "broadcast.render.t1", false},
		{"operator", "broadcast.requeue.t1", false},
		{"operator", "$KV.broadcast_progress.t1", false},
		{"operator", "$KV.broadcast_ledger.t1.0", false},
		{"operator", "$KV.broadcast_control.t1", false},
		{"operator", "$KV.broadcast_tasks.t1", false},
		// Nobody deletes, purges or reshapes the work queues; no new streams
		// (a stream could republish into broadcast.jobs.>).
		{"operator", "$JS.API.STREAM.UPDATE.JOBS", false},
		{"operator", "$JS.API.STREAM.DELETE.JOBS", false},
		{"operator", "$JS.API.STREAM.PURGE.JOBS", false},
		{"operator", "$JS.API.STREAM.CREATE.EVIL", false},
		{"operator", "$JS.API.CONSUMER.CREATE.JOBS.x.broadcast.jobs.>", false},
		{"ingest", "$JS.API.STREAM.DELETE.TASKS", false},
		{"ingest", "$JS.API.STREAM.CREATE.EVIL", false},
		{"render", "$JS.API.STREAM.PURGE.RENDER", false},
		{"dispatch", "$JS.API.STREAM.DELETE.DEAD", false},
		{"status", "$JS.API.STREAM.PURGE.EVENTS", false},
		{"status", "$JS.API.CONSUMER.DELETE.JOBS.dispatch-hook", false},
		// A new fold holder resets its partition's consumer, and no other.
		{"status", "$JS.API.CONSUMER.RESET.EVENTS.status-3-of-4", true},
		{"status", "$JS.API.CONSUMER.RESET.EVENTS.feedback-index", false},
		// Its short-lived consumers on EVENTS (the operator's pages) give it
		// no hold on feedback's durables there.
		{"status", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.feedback-index", false},
		{"status", "$JS.ACK.EVENTS.feedback-wxpusher.1.2.3.4.5.6", false},
		{"status", "$JS.API.CONSUMER.DELETE.EVENTS.feedback-index", false},
		{"status", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.status-1-of-2", true},
		{"operator", "$JS.API.CONSUMER.RESET.EVENTS.status", false},
		// Only admin (`broadcast setup`) creates or changes the topology:
		// the services and the operator only read it.
		{"ingest", "$JS.API.STREAM.CREATE.TASKS", false},
		{"ingest", "$JS.API.STREAM.UPDATE.TASKS", false},
		{"render", "$JS.API.STREAM.UPDATE.RENDER", false},
		{"dispatch", "$JS.API.STREAM.UPDATE.JOBS", false},
		{"dispatch", "$JS.API.STREAM.CREATE.KV_broadcast_leases", false},
		{"status", "$JS.API.STREAM.UPDATE.EVENTS", false},
		{"status", "$JS.API.STREAM.CREATE.OBJ_broadcast_status", false},
		{"operator", "$JS.API.STREAM.CREATE.TASKS", false},
		{"ingest", "$JS.API.STREAM.INFO.JOBS", true},
		{"admin", "$JS.API.STREAM.UPDATE.JOBS", true},
		{"admin", "$JS.API.STREAM.CREATE.KV_broadcast_ledger", true},
		// ... and nothing else: no deleting, purging or other streams, no
		// messages, no consumers.
		{"admin", "$JS.API.STREAM.DELETE.JOBS", false},
		{"admin", "$JS.API.STREAM.PURGE.JOBS", false},
		{"admin", "$JS.API.STREAM.CREATE.EVIL", false},
		{"admin", "broadcast.tasks", false},
		{"admin", "broadcast.jobs.hook.normal", false},
		{"admin", "$KV.broadcast_accounts.hook", false},
		{"admin", "$JS.API.CONSUMER.CREATE.JOBS.x.broadcast.jobs.>", false},
		{"admin", "$JS.API.DIRECT.GET.KV_broadcast_accounts.hook", false},
		// The operator never touches the services' durable consumers: no
		// removing or reconfiguring them, no taking or acknowledging their
		// messages.
		{"operator", "$JS.API.CONSUMER.DELETE.EVENTS.status", false},
		{"operator", "$JS.API.CONSUMER.DELETE.TASKS.ingest", false},
		{"operator", "$JS.API.CONSUMER.DELETE.TASKS.ingest-start", false},
		{"operator", "$JS.API.CONSUMER.CREATE.EVENTS.status", false},
		{"operator", "$JS.API.CONSUMER.CREATE.EVENTS.status.broadcast.events.>", false},
		{"operator", "$JS.API.CONSUMER.CREATE.TASKS.ingest.broadcast.tasks", false},
		{"operator", "$JS.API.CONSUMER.CREATE.TASKS.ingest-start", false},
		{"operator", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.status", false},
		{"operator", "$JS.API.CONSUMER.MSG.NEXT.TASKS.ingest", false},
		{"operator", "$JS.API.CONSUMER.MSG.NEXT.TASKS.ingest-start", false},
		{"operator", "$JS.ACK.EVENTS.status.1.10.10.1700000000000000000.0", false},
		{"operator", "$JS.ACK.TASKS.ingest.1.3.3.1700000000000000000.0", false},
		{"operator", "$JS.ACK.TASKS.ingest-start.1.3.3.1700000000000000000.0", false},
		{"operator", "$JS.API.CONSUMER.CREATE.RENDER.x.broadcast.render.>", false},
		{"operator", "$JS.API.CONSUMER.MSG.NEXT.JOBS.dispatch-hook", false},
		// ... while its own short-lived consumers on history still work.
		{"operator", "$JS.API.CONSUMER.CREATE.EVENTS.mine.broadcast.events.>", true},
		{"operator", "$JS.API.CONSUMER.MSG.NEXT.EVENTS.mine", true},
		{"operator", "$JS.API.CONSUMER.DELETE.EVENTS.mine", true},
		{"operator", "$JS.API.CONSUMER.DELETE.TASKS.ingest2", true},
		// The viewer reads progress and health, nothing with recipients'
		// data or account values, and changes nothing.
		{"viewer", "broadcast.tasks", false},
		{"viewer", "broadcast.control.t1", false},
		{"viewer", "$KV.broadcast_progress.t1", false},
		{"viewer", "$KV.broadcast_accounts.hook", false},
		{"viewer", "$JS.API.DIRECT.GET.KV_broadcast_accounts.hook", false},
		{"viewer", "$JS.API.DIRECT.GET.EVENTS", false},
		{"viewer", "$JS.API.STREAM.MSG.GET.JOBS", false},
		{"viewer", "$JS.API.STREAM.MSG.GET.DEAD", false},
		{"viewer", "$JS.API.CONSUMER.CREATE.EVENTS.x.broadcast.events.>", false},
		{"viewer", "$JS.API.CONSUMER.CREATE.DEAD.x.broadcast.dead.>", false},
		{"viewer", "$JS.API.CONSUMER.CREATE.OBJ_broadcast_recipients.x", false},
		{"viewer", "$JS.API.CONSUMER.CREATE.KV_broadcast_ledger.x", false},
		{"viewer", "$JS.API.DIRECT.GET.KV_broadcast_progress.t1", true},
		{"viewer", "$JS.API.CONSUMER.CREATE.KV_broadcast_progress.w.$KV.broadcast_progress.>", true},
		{"viewer", "$JS.API.DIRECT.GET.KV_broadcast_health.hook", true},
		// Grants (a misspelt deny would make these pass as denials).
		{"operator", "broadcast.tasks", true},
		{"operator", "broadcast.control.t1", true},
		{"operator", "$KV.broadcast_accounts.hook", true},
		{"ingest", "broadcast.events.t1.accepted", true},
		{"render", "broadcast.jobs.hook.normal", true},
		{"render", "broadcast.dead.t1", true}, // batches it gives up on
		{"dispatch", "broadcast.dead.t1", true},
		{"status", "broadcast.control.t1", true},
		// feedback publishes receipts and the receipt kinds of events, and
		// nothing else: no sent or failed events, no tasks, no jobs.
		{"feedback", "broadcast.receipts.whatsapp.wa", true},
		{"feedback", "broadcast.events.t1.delivered", true},
		{"feedback", "broadcast.events.t1.read", true},
		{"feedback", "broadcast.events.t1.undelivered", true},
		{"feedback", "broadcast.events.t1.sent", false},
		{"feedback", "broadcast.events.t1.failed", false},
		{"feedback", "broadcast.tasks", false},
		{"feedback", "broadcast.jobs.hook.normal", false},
		{"feedback", "broadcast.control.t1", false},
		{"feedback", "$KV.broadcast_accounts.hook", false},
		{"feedback", "$KV.broadcast_progress.t1", false},
		{"feedback", "$KV.broadcast_provider_ids.id.x", true},
		{"feedback", "$JS.API.CONSUMER.CREATE.EVENTS.status.broadcast.events.>", false},
		// Nobody else stores receipts: they would skip the signature check.
		{"operator", "broadcast.receipts.whatsapp.wa", false},
		{"dispatch", "broadcast.receipts.whatsapp.wa", false},
		{"operator", "$JS.API.CONSUMER.MSG.NEXT.RECEIPTS.feedback", false},
		// The suppression list: the operator (CLI) and feedback write it,
		// render and dispatch only read it, the viewer not even that.
		{"operator", "$KV.broadcast_suppressions.all.x", true},
		{"feedback", "$KV.broadcast_suppressions.whatsapp.x", true},
		{"render", "$KV.broadcast_suppressions.all.x", false},
		{"dispatch", "$KV.broadcast_suppressions.all.x", false},
		{"ingest", "$KV.broadcast_suppressions.all.x", false},
		{"render", "$JS.API.DIRECT.GET.KV_broadcast_suppressions.$KV.broadcast_suppressions.all.x", true},
		{"dispatch", "$JS.API.DIRECT.GET.KV_broadcast_suppressions.$KV.broadcast_suppressions.all.x", true},
		{"viewer", "$JS.API.DIRECT.GET.KV_broadcast_suppressions.x", false},
	}
	subscribes := []permCheck{
		{"render", "broadcast.control.*", false},   // intercepting control requests
		{"status", "broadcast.requeue.*", false},   // impersonating dispatch
		{"ingest", "broadcast.requeue.*", false},   //   "
		{"dispatch", "broadcast.control.*", false}, // impersonating ingest
		{"status", ">", false},
		{"operator", "$KV.>", false},
		{"operator", "$JS.API.>", false},
		{"operator", "broadcast.control.*", false}, // answering control requests
		{"operator", "broadcast.requeue.*", false}, // taking dispatch's re-queue requests
		{"ingest", "broadcast.control.*", true},
		{"dispatch", "broadcast.requeue.*", true},
		{"operator", "broadcast.events.>", true},
		{"viewer", "broadcast.events.>", false},
		{"viewer", "broadcast.>", false},
		{"admin", "broadcast.>", false},
	}

	probes := map[string]*permProbe{}
	for name, creds := range users {
		probes[name] = newPermProbe(t, cs.Server, creds)
	}
	var denied []string
	for _, c := range publishes {
		got := probes[c.user].attempt(t, c.subject, false)
		require.Equal(t, !c.allowed, got, "%s publish %s: denied=%v, want denied=%v", c.user, c.subject, got, !c.allowed)
		if got {
			denied = append(denied, c.user+" pub "+c.subject)
		}
	}
	for _, c := range subscribes {
		got := probes[c.user].attempt(t, c.subject, true)
		require.Equal(t, !c.allowed, got, "%s subscribe %s: denied=%v, want denied=%v", c.user, c.subject, got, !c.allowed)
		if got {
			denied = append(denied, c.user+" sub "+c.subject)
		}
	}
	t.Logf("%d denials asserted: %s", len(denied), strings.Join(denied, "; "))

	// The viewer reads progress through JetStream as `nats kv get` does.
	vctx, vcancel := context.WithTimeout(context.Background(), 5*time.Second)
	kv, err := probes["viewer"].js.KeyValue(vctx, contract.BucketProgress)
	require.NoError(t, err, "viewer opens broadcast_progress")
	_, err = kv.Get(vctx, "no-such-task")
	vcancel()
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a viewer's read is a read, not a permission error")

	// A job published by ingest through JetStream gets no ack and is not
	// stored.
	jobs := func() uint64 {
		st, err := cs.JS.Stream(context.Background(), contract.StreamJobs)
		require.NoError(t, err)
		return st.CachedInfo().State.Msgs
	}
	before := jobs()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = probes["ingest"].js.Publish(ctx, "broadcast.jobs.hook.normal", []byte(`{}`))
	cancel()
	require.Error(t, err, "ingest's job publish must not be acknowledged")
	require.Equal(t, before, jobs(), "JOBS holds nothing ingest published")

	// Nobody anonymous, and no wrong password.
	for _, creds := range []natstest.Credentials{{}, {User: "operator", Password: "wrong"}, {User: "nobody", Password: "x"}} {
		nc, err := cs.Dial(creds)
		if err == nil {
			nc.Close()
		}
		require.ErrorContains(t, err, "Authorization Violation", "connect as %q", creds.User)
	}
	// And the server's own view: no_auth_user is unset and every user has
	// permissions.
	opts, err := server.ProcessConfigFile(natsConfPath)
	require.NoError(t, err)
	require.Empty(t, opts.NoAuthUser, "no_auth_user must stay unset")
	require.Len(t, opts.Users, 8) // five services, operator, viewer, admin
	for _, u := range opts.Users {
		require.NotNil(t, u.Permissions, "user %s has permissions", u.Username)
		require.True(t, strings.HasPrefix(u.Password, "$2a$"), "user %s: auth.conf keeps a bcrypt hash, not the password", u.Username)
	}
}

// permProbe is a connection as one user that records the permission
// violations the server reports to it.
type permProbe struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	violations chan string
}

func newPermProbe(t *testing.T, ts *pipelinetest.Server, creds natstest.Credentials) *permProbe {
	t.Helper()
	p := &permProbe{violations: make(chan string, 64)}
	p.nc, p.js = ts.ConnectAs(t, creds, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			p.violations <- err.Error()
		}
	}))
	return p
}

// attempt publishes to (or subscribes on) subject and reports whether the
// server answered with a permissions violation naming it.
func (p *permProbe) attempt(t *testing.T, subject string, subscribe bool) bool {
	t.Helper()
	if subscribe {
		sub, err := p.nc.SubscribeSync(subject)
		require.NoError(t, err)
		defer func() { _ = sub.Unsubscribe() }()
	} else {
		require.NoError(t, p.nc.Publish(subject, []byte(`{"probe":true}`)))
	}
	// The server answers -ERR before the PONG of this flush; the callback
	// runs shortly after.
	require.NoError(t, p.nc.Flush())
	select {
	case v := <-p.violations:
		require.Contains(t, v, `"`+subject+`"`, "the violation names the subject")
		return true
	case <-time.After(250 * time.Millisecond):
		return false
	}
}
