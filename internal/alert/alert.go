// Package alert calls the operator's webhook (ALERT_URL) with a short
// text when something needs a person: a JSON body {"text":"..."}, which
// Slack incoming webhooks and compatible receivers (WeCom bridges,
// Mattermost, Rocket.Chat) accept. At most one alert per subject per
// interval is sent, so a flapping account or a task failing recipient by
// recipient does not flood the channel.
package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Results of an Alert call, for metrics.
const (
	Sent       = "sent"
	Suppressed = "suppressed"
	Failed     = "failed"
	Dropped    = "dropped"
)

// Config tunes a Notifier.
type Config struct {
	// URL is the operator webhook (ALERT_URL). Empty: no alerts.
	URL string
	// Interval is the least time between two alerts of one subject
	// (ALERT_INTERVAL). Defaults to 10 minutes.
	Interval time.Duration
	// Client posts the alerts. Defaults to one with a 10 s timeout.
	Client *http.Client
	// Count, when set, is told each alert's result (Sent, Suppressed,
	// Failed, Dropped).
	Count func(result string)
	// Now defaults to time.Now.
	Now func() time.Time
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Notifier sends alerts. A nil *Notifier sends nothing.
type Notifier struct {
	cfg   Config
	mu    sync.Mutex
	last  map[string]time.Time
	slots chan struct{}
	wg    sync.WaitGroup
}

// maxInFlight bounds the posts under way; an alert beyond it is dropped
// (and counted), never queued without bound.
const maxInFlight = 8

// New returns a Notifier, or nil when cfg.URL is empty. The URL must be
// http or https.
func New(cfg Config) (*Notifier, error) {
	if cfg.URL == "" {
		return nil, nil
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("ALERT_URL: want an http(s) URL")
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("ALERT_INTERVAL: must not be negative, got %s", cfg.Interval)
	}
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Minute
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Notifier{cfg: cfg, last: map[string]time.Time{}, slots: make(chan struct{}, maxInFlight)}, nil
}

// Alert sends text unless an alert of subject went out within the
// interval; it returns at once (the post runs in the background) and
// reports whether the alert was sent on its way.
func (n *Notifier) Alert(subject, text string) bool {
	if n == nil {
		return false
	}
	now := n.cfg.Now()
	n.mu.Lock()
	if at, ok := n.last[subject]; ok && now.Sub(at) < n.cfg.Interval {
		n.mu.Unlock()
		n.count(Suppressed)
		return false
	}
	n.last[subject] = now
	if len(n.last) > 10_000 {
		// Subjects name tasks: forget those past their interval.
		for s, at := range n.last {
			if now.Sub(at) >= n.cfg.Interval {
				delete(n.last, s)
			}
		}
	}
	n.mu.Unlock()
	select {
	case n.slots <- struct{}{}:
	default:
		n.count(Dropped)
		n.cfg.Logger.Warn("alert dropped: too many alerts in flight", "subject", subject)
		return false
	}
	n.wg.Go(func() {
		defer func() { <-n.slots }()
		if err := n.post(text); err != nil {
			n.count(Failed)
			n.cfg.Logger.Warn("alert not delivered", "subject", subject, "err", err)
			return
		}
		n.count(Sent)
	})
	return true
}

// Wait waits for the posts under way.
func (n *Notifier) Wait() {
	if n != nil {
		n.wg.Wait()
	}
}

func (n *Notifier) count(result string) {
	if n.cfg.Count != nil {
		n.cfg.Count(result)
	}
}

// post sends one alert, trying a second time after a second when the
// receiver did not take it.
func (n *Notifier) post(text string) error {
	body, err := json.Marshal(map[string]string{"text": text})
	if err != nil {
		return err
	}
	var last error
	for try := range 2 {
		if try > 0 {
			time.Sleep(time.Second)
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.Client.Timeout+time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.cfg.URL, bytes.NewReader(body))
		if err != nil {
			cancel()
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := n.cfg.Client.Do(req)
		cancel()
		if err != nil {
			// The URL may carry a token (Slack's does): never in logs.
			last = fmt.Errorf("posting to the alert webhook failed")
			continue
		}
		resp.Body.Close()
		if resp.StatusCode/100 == 2 {
			return nil
		}
		last = fmt.Errorf("alert webhook answered %d", resp.StatusCode)
	}
	return last
}
