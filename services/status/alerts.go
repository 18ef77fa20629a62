package status

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// noteFold sends the alerts a folded event may call for: the task ended
// partial or failed, or its dead letters reached the threshold. Only the
// folding process folds, so only it alerts; a fold replayed after a crash
// may alert again, at most once per subject per interval.
func (s *Service) noteFold(f *taskFold, wasFinal bool, failedBefore int) {
	if s.alerts == nil {
		return
	}
	p := &f.P
	if !wasFinal && (p.State == contract.StatePartial || p.State == contract.StateFailed) {
		s.alerts.Alert("task."+p.TaskID+".final", fmt.Sprintf("Broadcast: task %s ended %s: %d of %d sent, %d failed, %d skipped, %d expired",
			p.TaskID, p.State, p.Sent, p.Total, p.Failed, p.Skipped, p.Expired))
	}
	if t := s.cfg.AlertDeadThreshold; failedBefore < t && p.Failed >= t {
		s.alerts.Alert("task."+p.TaskID+".dead", fmt.Sprintf("Broadcast: task %s has %d dead letters (threshold %d); `broadcast retry-dead %s` re-queues them",
			p.TaskID, p.Failed, t, p.TaskID))
	}
}

// alertTripped tells the operator the circuit breaker paused a task.
func (s *Service) alertTripped(taskID, reason string) {
	s.cfg.metrics.Tripped()
	s.alerts.Alert("task."+taskID+".breaker", fmt.Sprintf("Broadcast: task %s paused (%s)", taskID, reason))
}

// watchAccountPauses alerts when an account becomes paused (KV
// broadcast_health), while this process holds the fold lease: standbys
// watch too but stay quiet, so one alert goes out however many status
// processes run. Accounts already paused when status starts are not news.
func (s *Service) watchAccountPauses(ctx context.Context) error {
	if s.alerts == nil {
		return nil
	}
	var (
		mu     sync.Mutex
		paused = map[string]bool{}
		view   atomic.Pointer[shared.KVView[*contract.AccountHealth]]
	)
	onChange := func(name string) {
		v := view.Load()
		if v == nil {
			return // the initial values, read below
		}
		h, _ := v.Get(name)
		now := h != nil && !h.Healthy()
		mu.Lock()
		was := paused[name]
		paused[name] = now
		mu.Unlock()
		if now && !was && s.parts[0].holds.Load() != nil {
			s.alerts.Alert("account."+name+".paused", fmt.Sprintf("Broadcast: account %s paused: %s", name, h.Reason))
		}
	}
	v, err := shared.WatchKV(ctx, s.js, contract.BucketHealth, func(b []byte) (*contract.AccountHealth, error) {
		var h contract.AccountHealth
		err := json.Unmarshal(b, &h)
		return &h, err
	}, s.log, onChange)
	if err != nil {
		return err
	}
	mu.Lock()
	for _, name := range v.Keys() {
		h, _ := v.Get(name)
		paused[name] = h != nil && !h.Healthy()
	}
	mu.Unlock()
	view.Store(v)
	return nil
}

// qualityRank orders quality ratings from best to worst.
func qualityRank(q string) int {
	switch q {
	case contract.QualityYellow:
		return 1
	case contract.QualityRed:
		return 2
	}
	return 0
}

// qualityAlerts calls ALERT_URL when an account's quality rating drops
// (to YELLOW or RED, KV broadcast_signals); it is the signals watcher's
// callback, and seen holds each account's last rating.
type qualityAlerts struct {
	s *Service
	// view is the signals, set once loaded (before that, changes are the
	// initial values, which seed reads).
	view atomic.Pointer[shared.SignalsWatcher]
	mu   sync.Mutex
	seen map[string]string
}

func (q *qualityAlerts) changed(name string) {
	v := q.view.Load()
	if v == nil {
		return
	}
	sig := v.Get(name)
	now := sig.QualityOrUnknown()
	q.mu.Lock()
	was := q.seen[name]
	q.seen[name] = now
	q.mu.Unlock()
	if qualityRank(now) > qualityRank(was) && q.s.alerts != nil && q.s.parts[0].holds.Load() != nil {
		effect := "rate ceiling halved"
		if sig.HoldsMarketing() {
			effect = "marketing sends held, others at half rate"
		}
		q.s.alerts.Alert("account."+name+".quality."+strings.ToLower(now), fmt.Sprintf("Broadcast: account %s quality dropped to %s (%s); %s",
			name, now, sig.Event, effect))
	}
}

// seed records the ratings loaded before the first change.
func (q *qualityAlerts) seed(v *shared.SignalsWatcher) {
	q.mu.Lock()
	for _, name := range v.Accounts() {
		q.seen[name] = v.Get(name).QualityOrUnknown()
	}
	q.mu.Unlock()
	q.view.Store(v)
}
