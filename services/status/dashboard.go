package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/shared"
)

// maxListedTasks bounds the tasks one snapshot lists: running ones first,
// then the most recent.
const maxListedTasks = 200

// Snapshot is what the dashboard shows; GET /api/events streams it and
// GET /api/tasks and /api/accounts return its parts.
type Snapshot struct {
	At time.Time `json:"at"`
	// Tasks lists unfinished tasks first, then finished ones, newest first
	// within each group, at most 200.
	Tasks []*contract.Progress `json:"tasks"`
	// More is how many tasks were left out of Tasks.
	More     int           `json:"more"`
	Accounts []AccountView `json:"accounts"`
}

// AccountView is one sender account as the dashboard shows it: its
// configuration (KV broadcast_accounts), its health (KV broadcast_health)
// and its queue (its JOBS consumers, one per priority: dispatch-<account>,
// dispatch_high-<account>, dispatch_low-<account>).
type AccountView struct {
	Name    string `json:"name"`
	Channel string `json:"channel"`
	Enabled bool   `json:"enabled"`
	// State is "healthy" or "paused"; Reason says why it is paused.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// RatePerSec is the effective (adaptive) rate dispatch last reported,
	// 0 when it has not reported yet; Ceiling is the configured rate.
	RatePerSec float64 `json:"rate_per_sec"`
	Ceiling    float64 `json:"ceiling"`
	DailyUsed  int     `json:"daily_used"`
	DailyCap   int     `json:"daily_cap"`
	// WarmupCap and WarmupDay describe the warm-up ramp; Portfolio and its
	// counts the limit the account shares (KV broadcast_health).
	WarmupCap     int    `json:"warmup_cap,omitempty"`
	WarmupDay     int    `json:"warmup_day,omitempty"`
	Portfolio     string `json:"portfolio,omitempty"`
	PortfolioUsed int    `json:"portfolio_used,omitempty"`
	PortfolioCap  int    `json:"portfolio_cap,omitempty"`
	// Quality is the provider's rating (KV broadcast_signals), with what
	// it does in QualityReason; MarketingHeld when RED holds marketing.
	Quality       string `json:"quality,omitempty"`
	QualityReason string `json:"quality_reason,omitempty"`
	MarketingHeld bool   `json:"marketing_held,omitempty"`
	// Score is the health score over the last hour (KV broadcast_scores),
	// nil before one is written.
	Score *contract.AccountScore `json:"score,omitempty"`
	// QueueDepth is jobs not yet delivered to dispatch; InFlight delivered
	// and not yet acknowledged. Both are polled every PollInterval.
	QueueDepth uint64 `json:"queue_depth"`
	InFlight   int    `json:"in_flight"`
	// HealthAt is when dispatch last wrote the account's health.
	HealthAt *time.Time `json:"health_at,omitempty"`
}

// queueInfo is an account consumer's polled state.
type queueInfo struct {
	pending  uint64
	inFlight int
}

// dashboard keeps what the dashboard and the polled metrics need: every
// task's progress (watched in KV broadcast_progress, which this service
// writes, so the page shows exactly what clients read), the accounts and
// their health, and the account queues.
type dashboard struct {
	js       jetstream.JetStream
	log      *slog.Logger
	metrics  *metrics.Status
	progress *shared.KVView[*contract.Progress]
	accounts *shared.AccountWatcher
	health   *shared.HealthWatcher
	signals  *shared.SignalsWatcher
	scores   *shared.KVView[*contract.AccountScore]
	// series are the charts' data (series.go), sampled here every second.
	series *seriesStore

	mu     sync.Mutex
	queues map[string]queueInfo
	// wake is closed (and replaced) whenever something shown changes.
	wake    chan struct{}
	version uint64
	// cached is the last snapshot's JSON, valid while cachedVer == version
	// and younger than a second (rates and "at" move on).
	cached    []byte
	cachedVer uint64
	cachedAt  time.Time
}

func newDashboard(ctx context.Context, js jetstream.JetStream, log *slog.Logger, m *metrics.Status) (*dashboard, error) {
	d := &dashboard{js: js, log: log, metrics: m, queues: map[string]queueInfo{}, wake: make(chan struct{})}
	var err error
	if d.progress, err = shared.WatchKV(ctx, js, contract.BucketProgress, func(b []byte) (*contract.Progress, error) {
		var p contract.Progress
		err := json.Unmarshal(b, &p)
		return &p, err
	}, log, func(string) { d.changed() }); err != nil {
		return nil, err
	}
	if d.accounts, err = shared.WatchAccounts(ctx, js, log, func(shared.AccountChange) { d.changed() }); err != nil {
		return nil, err
	}
	if d.health, err = shared.WatchHealth(ctx, js, log); err != nil {
		return nil, err
	}
	if d.signals, err = shared.WatchSignals(ctx, js, log, func(string) { d.changed() }); err != nil {
		return nil, err
	}
	if d.scores, err = shared.WatchKV(ctx, js, contract.BucketScores, func(b []byte) (*contract.AccountScore, error) {
		var v contract.AccountScore
		err := json.Unmarshal(b, &v)
		return &v, err
	}, log, func(string) { d.changed() }); err != nil {
		return nil, err
	}
	return d, nil
}

// changed wakes every stream waiting for news.
func (d *dashboard) changed() {
	d.mu.Lock()
	d.version++
	close(d.wake)
	d.wake = make(chan struct{})
	d.mu.Unlock()
}

// changes returns a channel closed at the next change.
func (d *dashboard) changes() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.wake
}

// snapshot assembles what the dashboard shows now.
func (d *dashboard) snapshot() *Snapshot {
	snap := &Snapshot{At: time.Now().UTC(), Tasks: []*contract.Progress{}, Accounts: []AccountView{}}
	for _, id := range d.progress.Keys() {
		if p, ok := d.progress.Get(id); ok {
			snap.Tasks = append(snap.Tasks, p)
		}
	}
	sort.Slice(snap.Tasks, func(i, j int) bool {
		a, b := snap.Tasks[i], snap.Tasks[j]
		if af, bf := a.State.Final(), b.State.Final(); af != bf {
			return !af
		}
		if !a.CreatedAt.Equal(b.CreatedAt) {
			return a.CreatedAt.After(b.CreatedAt)
		}
		return a.TaskID < b.TaskID
	})
	if len(snap.Tasks) > maxListedTasks {
		snap.More = len(snap.Tasks) - maxListedTasks
		snap.Tasks = snap.Tasks[:maxListedTasks]
	}
	d.mu.Lock()
	queues := make(map[string]queueInfo, len(d.queues))
	for k, v := range d.queues {
		queues[k] = v
	}
	d.mu.Unlock()
	for _, a := range d.accounts.All() {
		v := AccountView{Name: a.Name, Channel: a.Channel, Enabled: a.IsEnabled(), State: contract.HealthHealthy,
			Ceiling: a.RatePerSec, DailyCap: a.DailyCap}
		if h := d.health.Get(a.Name); h != nil {
			v.State, v.Reason = h.State, h.Reason
			v.RatePerSec, v.DailyUsed = h.RatePerSec, h.DailyUsed
			if h.Ceiling > 0 {
				v.Ceiling = h.Ceiling
			}
			if h.DailyCap > 0 {
				v.DailyCap = h.DailyCap
			}
			v.WarmupCap, v.WarmupDay = h.WarmupCap, h.WarmupDay
			v.Portfolio, v.PortfolioUsed, v.PortfolioCap = h.Portfolio, h.PortfolioUsed, h.PortfolioCap
			v.QualityReason, v.MarketingHeld = h.QualityReason, h.MarketingHeld
			at := h.UpdatedAt
			v.HealthAt = &at
		}
		if sig := d.signals.Get(a.Name); sig != nil {
			v.Quality = sig.QualityOrUnknown()
		}
		if sc, ok := d.scores.Get(a.Name); ok {
			v.Score = sc
		}
		q := queues[a.Name]
		v.QueueDepth, v.InFlight = q.pending, q.inFlight
		snap.Accounts = append(snap.Accounts, v)
	}
	return snap
}

// snapshotJSON is the snapshot encoded once for every stream that asks
// within the same version and second.
func (d *dashboard) snapshotJSON() []byte {
	d.mu.Lock()
	ver := d.version
	if d.cached != nil && d.cachedVer == ver && time.Since(d.cachedAt) < time.Second {
		b := d.cached
		d.mu.Unlock()
		return b
	}
	d.mu.Unlock()
	b, err := json.Marshal(d.snapshot())
	if err != nil { // cannot happen with these types
		d.log.Error("dashboard snapshot does not encode", "err", err)
		return []byte(`{}`)
	}
	d.mu.Lock()
	d.cached, d.cachedVer, d.cachedAt = b, ver, time.Now()
	d.mu.Unlock()
	return b
}

func (d *dashboard) task(id string) (*contract.Progress, bool) { return d.progress.Get(id) }

// control forwards a control request to broadcast.control.<task>.
func (d *dashboard) control(ctx context.Context, taskID, action string) (*contract.ControlReply, error) {
	return client.Control(ctx, d.js.Conn(), taskID, action)
}

// poll refreshes queue depths and the polled metrics every interval until
// ctx ends.
func (d *dashboard) poll(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		d.pollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// accountOfConsumer returns the account whose jobs a dispatch consumer of
// JOBS reads, from its filter subject (broadcast.jobs.<account>.<priority>,
// or broadcast.jobs.<account>.> for the single consumer of earlier
// versions), so every priority lane of an account adds to its queue.
func accountOfConsumer(info *jetstream.ConsumerInfo) (string, bool) {
	if !strings.HasPrefix(info.Name, contract.DispatchConsumerPrefix) {
		return "", false
	}
	rest, ok := strings.CutPrefix(info.Config.FilterSubject, contract.SubjectJobsPrefix)
	if !ok {
		return "", false
	}
	account, _, ok := strings.Cut(rest, ".")
	return account, ok && account != ""
}

func (d *dashboard) pollOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	queues := map[string]queueInfo{}
	stream, err := d.js.Stream(ctx, contract.StreamJobs)
	// JOBS is a work queue: with no message in it every queue is empty, and
	// listing the consumers (three per account, so thousands) is skipped.
	if err == nil && stream.CachedInfo().State.Msgs > 0 {
		lister := stream.ListConsumers(ctx)
		for info := range lister.Info() {
			if name, ok := accountOfConsumer(info); ok {
				q := queues[name]
				q.pending += info.NumPending
				q.inFlight += info.NumAckPending
				queues[name] = q
			}
		}
		err = lister.Err()
	}
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("cannot read account queues", "err", err)
		}
		return
	}
	d.mu.Lock()
	same := len(queues) == len(d.queues)
	for k, v := range queues {
		if d.queues[k] != v {
			same = false
		}
	}
	d.queues = queues
	d.mu.Unlock()
	if !same {
		d.changed()
	}

	if d.metrics == nil {
		return
	}
	var gauges []metrics.AccountGauges
	for _, a := range d.accounts.All() {
		q := queues[a.Name]
		g := metrics.AccountGauges{Name: a.Name, QueueDepth: q.pending, InFlight: q.inFlight,
			Paused: !d.health.Get(a.Name).Healthy(), Score: -1, Quality: d.signals.Get(a.Name).QualityOrUnknown(),
			DailyCap: a.DailyCap}
		if h := d.health.Get(a.Name); h != nil {
			g.DailyCap, g.DailyUsed = h.DailyCap, h.DailyUsed
		}
		if sc, ok := d.scores.Get(a.Name); ok {
			g.Score = sc.Score
		}
		gauges = append(gauges, g)
	}
	d.metrics.SetAccounts(gauges)
	counts := map[contract.TaskState]int{}
	for _, id := range d.progress.Keys() {
		if p, ok := d.progress.Get(id); ok {
			counts[p.State]++
		}
	}
	d.metrics.SetTasks(counts)
}

// startDashboard starts the queue poller (when there are metrics or a
// dashboard) and the dashboard's HTTP server (when DashboardAddr is set).
// They run until ctx ends or stop is called; stop waits for them.
func (s *Service) startDashboard(ctx context.Context) (stop func(), err error) {
	if s.cfg.DashboardAddr == "" && s.cfg.metrics == nil {
		return func() {}, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	d, err := newDashboard(ctx, s.js, s.log, s.cfg.metrics)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	d.series = s.series
	var ln net.Listener
	if s.cfg.DashboardAddr != "" {
		if ln, err = net.Listen("tcp", s.cfg.DashboardAddr); err != nil {
			cancel()
			return nil, fmt.Errorf("dashboard: listen on %s: %w (DASHBOARD_ADDR=off turns it off)", s.cfg.DashboardAddr, err)
		}
	}
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	wg.Go(func() {
		shared.Supervise(ctx, s.log, "dashboard poller", func(ctx context.Context) { d.poll(ctx, s.cfg.PollInterval) })
	})
	if ln == nil {
		return stop, nil
	}
	wg.Go(func() { shared.Supervise(ctx, s.log, "chart sampler", d.sampleSeries) })
	srv := &http.Server{
		Handler: newHandler(d, s.cfg.Metrics, s.log,
			newGuard(ln.Addr(), s.cfg.DashboardToken, s.cfg.DashboardHosts).withViewer(s.cfg.DashboardViewerToken), s.cfg.MaxEventStreams),
		ReadHeaderTimeout: 10 * time.Second,
		// Requests have no body worth waiting for; event streams write, and
		// have no write timeout for that reason.
		ReadTimeout:    30 * time.Second,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		// Event streams end with the service.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	url := "http://" + ln.Addr().String() + "/"
	s.dashboardURL.Store(&url)
	s.log.Info("dashboard serving", "url", url)
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("dashboard server stopped", "err", err)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	return stop, nil
}

// DashboardURL returns the dashboard's base URL once it is serving (with
// the port chosen when DashboardAddr asked for port 0), or "".
func (s *Service) DashboardURL() string {
	if u := s.dashboardURL.Load(); u != nil {
		return *u
	}
	return ""
}
