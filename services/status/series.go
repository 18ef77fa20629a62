package status

import (
	"context"
	"sync"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// Series keep what happened per second for the last hour and per minute
// for the last day, for each task and each account, so the dashboard can
// draw how a send went over time. They are fed by the events the fold
// applies (so only the process holding the fold lease has them; a standby
// answers empty series) and by a once-a-second sample of each account's
// effective rate, ceiling and queue depth.
//
// Memory is bounded: a series is two rings of fixed size (secondsKept and
// minutesKept buckets of bucketBytes each, 262 KB), and at most
// Config.SeriesLimit task series and as many account series exist. A new
// series beyond the limit evicts, of its kind, the ended one (a task in a
// final state) idle longest, else the one idle longest.
const (
	secondsKept = 3600
	minutesKept = 1440
	// bucketBytes is the size of one bucket (its time, six counts, two
	// rates, a queue depth, the daily window, a flag), for the memory
	// bound in docs/dashboard.md: a series is
	// (secondsKept+minutesKept)*bucketBytes, 262 KB.
	bucketBytes = 52
)

// seriesBucket counts one second or one minute. At is its start in
// seconds (per-second ring) or minutes (per-minute ring) since the epoch;
// a bucket whose At is not the one asked for is empty.
type seriesBucket struct {
	at                                               uint32
	sent, retrying, failed, skipped, delivered, read uint32
	// rate and ceiling are the account's effective rate and configured
	// ceiling last sampled in the bucket; queue its jobs waiting;
	// dailyUsed and dailyCap its rolling 24 h window.
	rate, ceiling              float32
	queue, dailyUsed, dailyCap uint32
	sampled                    bool
}

func (b *seriesBucket) add(kind contract.EventKind) {
	switch kind {
	case contract.EventSent:
		b.sent++
	case contract.EventRetrying:
		b.retrying++
	case contract.EventFailed:
		b.failed++
	case contract.EventSkipped:
		b.skipped++
	case contract.EventDelivered:
		b.delivered++
	case contract.EventRead:
		b.read++
	}
}

// series is one task's or account's two rings.
type series struct {
	sec [secondsKept]seriesBucket
	min [minutesKept]seriesBucket
	// first and last are when the series first and last got an event.
	first, last time.Time
	// ended is set once the task is in a final state (never for accounts).
	ended bool
}

// slot returns the ring bucket for unit t (seconds or minutes), emptied
// when it held an older unit.
func slot(ring []seriesBucket, t int64) *seriesBucket {
	b := &ring[t%int64(len(ring))]
	if b.at != uint32(t) {
		*b = seriesBucket{at: uint32(t)}
	}
	return b
}

func (s *series) add(kind contract.EventKind, at time.Time) {
	if s.first.IsZero() || at.Before(s.first) {
		s.first = at
	}
	if at.After(s.last) {
		s.last = at
	}
	slot(s.sec[:], at.Unix()).add(kind)
	slot(s.min[:], at.Unix()/60).add(kind)
}

// accountSample is what the sampler reads of an account each second.
type accountSample struct {
	rate, ceiling       float64
	queue               uint64
	dailyUsed, dailyCap int
}

func (s *series) sample(a accountSample, now time.Time) {
	for _, b := range []*seriesBucket{slot(s.sec[:], now.Unix()), slot(s.min[:], now.Unix()/60)} {
		b.rate, b.ceiling, b.queue, b.sampled = float32(a.rate), float32(a.ceiling), uint32(min(a.queue, 1<<32-1)), true
		b.dailyUsed, b.dailyCap = uint32(max(a.dailyUsed, 0)), uint32(max(a.dailyCap, 0))
	}
}

// seriesStore holds every series; safe for concurrent use.
type seriesStore struct {
	limit int

	mu       sync.Mutex
	tasks    map[string]*series
	accounts map[string]*series
	now      func() time.Time
}

func newSeriesStore(limit int) *seriesStore {
	return &seriesStore{limit: max(limit, 1), tasks: map[string]*series{}, accounts: map[string]*series{}, now: time.Now}
}

// record counts one event the fold applied. Events older than a day are
// not counted; events stamped in the future count now.
func (st *seriesStore) record(ev *contract.Event) {
	switch ev.Kind {
	case contract.EventSent, contract.EventRetrying, contract.EventFailed, contract.EventSkipped,
		contract.EventDelivered, contract.EventRead:
	default:
		return
	}
	now := st.now()
	at := ev.At
	if at.After(now) || at.IsZero() {
		at = now
	}
	if now.Sub(at) >= minutesKept*time.Minute {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if ts := st.get(st.tasks, ev.TaskID, now); ts != nil {
		ts.add(ev.Kind, at)
	}
	if ev.Account != "" {
		if as := st.get(st.accounts, ev.Account, now); as != nil {
			as.add(ev.Kind, at)
		}
	}
}

// ended marks a task's series ended, first in line for eviction.
func (st *seriesStore) ended(taskID string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := st.tasks[taskID]; s != nil {
		s.ended = true
	}
}

// sampleAccount records an account's effective rate, ceiling, queue
// depth and daily window now, when the account has a series (it had
// events).
func (st *seriesStore) sampleAccount(name string, a accountSample) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := st.accounts[name]; s != nil {
		s.sample(a, st.now())
	}
}

// dropAccounts deletes the series of every account that exists says is
// gone, so a deleted account's 262 KB go with it rather than wait to be
// evicted.
func (st *seriesStore) dropAccounts(exists func(name string) bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for name := range st.accounts {
		if !exists(name) {
			delete(st.accounts, name)
		}
	}
}

// size returns how many task and account series exist.
func (st *seriesStore) size() (tasks, accounts int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.tasks), len(st.accounts)
}

// get returns name's series in m, creating it when m has room or a
// series to give up: an ended task's, or one without an event for
// evictAfter. When every series is in use it returns nil and name is not
// charted: at more accounts than the limit, the first ones keep their
// charts instead of all of them taking turns (each turn was a new 262 KB
// series). An evicted series's memory is reused. Call with st.mu held.
func (st *seriesStore) get(m map[string]*series, name string, now time.Time) *series {
	if s := m[name]; s != nil {
		return s
	}
	if len(m) < st.limit {
		s := new(series)
		m[name] = s
		return s
	}
	var victim string
	var vs *series
	for n, s := range m {
		if vs == nil || s.ended && !vs.ended || s.ended == vs.ended && s.last.Before(vs.last) {
			victim, vs = n, s
		}
	}
	if vs == nil || !vs.ended && now.Sub(vs.last) < evictAfter {
		return nil
	}
	delete(m, victim)
	*vs = series{}
	m[name] = vs
	return vs
}

// evictAfter is how long a series of a running task or of an account must
// have had no event before a new one may take its place.
const evictAfter = 10 * time.Minute

// SeriesView is GET /api/series's answer: one task's or account's counts
// per second (the last Seconds asked for, from its first event) and per
// minute (the last day, from its first event).
type SeriesView struct {
	Task    string `json:"task,omitempty"`
	Account string `json:"account,omitempty"`
	// At is when the view was taken.
	At        time.Time   `json:"at"`
	PerSecond SeriesRange `json:"per_second"`
	PerMinute SeriesRange `json:"per_minute"`
}

// SeriesRange is a run of equal steps from Start, one value per step in
// each column. RatePerSec, Ceiling, QueueDepth, DailyUsed and DailyCap
// (accounts only) are the account's last sample in the step, 0 where none
// was taken; for a task, Sent per step is its effective rate.
type SeriesRange struct {
	Start       time.Time `json:"start"`
	StepSeconds int       `json:"step_seconds"`
	Sent        []uint32  `json:"sent"`
	Retrying    []uint32  `json:"retrying"`
	Failed      []uint32  `json:"failed"`
	Skipped     []uint32  `json:"skipped"`
	Delivered   []uint32  `json:"delivered"`
	Read        []uint32  `json:"read"`
	RatePerSec  []float32 `json:"rate_per_sec,omitempty"`
	Ceiling     []float32 `json:"ceiling,omitempty"`
	QueueDepth  []uint32  `json:"queue_depth,omitempty"`
	DailyUsed   []uint32  `json:"daily_used,omitempty"`
	DailyCap    []uint32  `json:"daily_cap,omitempty"`
}

// view returns the series of a task (account false) or an account, with
// the last seconds seconds per second (at most an hour), or false when it
// has none.
func (st *seriesStore) view(name string, account bool, seconds int) (*SeriesView, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	m := st.tasks
	if account {
		m = st.accounts
	}
	s := m[name]
	if s == nil {
		return nil, false
	}
	now := st.now().UTC()
	v := &SeriesView{At: now}
	if account {
		v.Account = name
	} else {
		v.Task = name
	}
	seconds = min(max(seconds, 1), secondsKept)
	first := s.first.Unix()
	v.PerSecond = columns(s.sec[:], max(now.Unix()-int64(seconds)+1, first), now.Unix(), 1, account)
	v.PerMinute = columns(s.min[:], max(now.Unix()/60-minutesKept+1, first/60), now.Unix()/60, 60, account)
	return v, true
}

// columns reads units from..to of ring into a range.
func columns(ring []seriesBucket, from, to int64, step int, account bool) SeriesRange {
	n := max(int(to-from+1), 0)
	r := SeriesRange{Start: time.Unix(from*int64(step), 0).UTC(), StepSeconds: step,
		Sent: make([]uint32, n), Retrying: make([]uint32, n), Failed: make([]uint32, n),
		Skipped: make([]uint32, n), Delivered: make([]uint32, n), Read: make([]uint32, n)}
	if account {
		r.RatePerSec, r.Ceiling, r.QueueDepth = make([]float32, n), make([]float32, n), make([]uint32, n)
		r.DailyUsed, r.DailyCap = make([]uint32, n), make([]uint32, n)
	}
	for i := range n {
		b := ring[(from+int64(i))%int64(len(ring))]
		if b.at != uint32(from+int64(i)) {
			continue
		}
		r.Sent[i], r.Retrying[i], r.Failed[i], r.Skipped[i], r.Delivered[i], r.Read[i] =
			b.sent, b.retrying, b.failed, b.skipped, b.delivered, b.read
		if account && b.sampled {
			r.RatePerSec[i], r.Ceiling[i], r.QueueDepth[i] = b.rate, b.ceiling, b.queue
			r.DailyUsed[i], r.DailyCap[i] = b.dailyUsed, b.dailyCap
		}
	}
	return r
}

// chart feeds an event the fold applied to the series: every outcome that
// changed a recipient, and every retrying attempt (a second retry of one
// recipient changes no count but is an attempt worth drawing). A task in
// a final state has its series marked ended. Call with s.mu held.
func (s *Service) chart(f *taskFold, ev *contract.Event, changed bool) {
	if ev.Index < 0 || s.series == nil {
		return
	}
	if changed || ev.Kind == contract.EventRetrying {
		s.series.record(ev)
	}
	if f.P.State.Final() {
		s.series.ended(ev.TaskID)
	}
}

// sampleSeries records every account's effective rate, ceiling, queue
// depth and daily window in its series once a second until ctx ends, and
// drops the series of accounts deleted from the bucket (one whose value
// does not parse keeps its series).
func (d *dashboard) sampleSeries(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.mu.Lock()
		queues := make(map[string]queueInfo, len(d.queues))
		for k, v := range d.queues {
			queues[k] = v
		}
		d.mu.Unlock()
		for _, a := range d.accounts.All() {
			s := accountSample{ceiling: a.RatePerSec, queue: queues[a.Name].pending, dailyCap: a.DailyCap}
			if h := d.health.Get(a.Name); h != nil {
				s.rate, s.dailyUsed = h.RatePerSec, h.DailyUsed
				if h.Ceiling > 0 {
					s.ceiling = h.Ceiling
				}
				if h.DailyCap > 0 {
					s.dailyCap = h.DailyCap
				}
			}
			d.series.sampleAccount(a.Name, s)
		}
		d.series.dropAccounts(func(name string) bool {
			return d.accounts.Get(name) != nil || d.accounts.Invalid(name) != nil
		})
	}
}
