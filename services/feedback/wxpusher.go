package feedback

// WxPusher status poller. WxPusher posts no receipts: its send answers
// code 1000 ("send task created") with a sendRecordId per uid, which
// dispatch records as the sent event's provider id, and the outcome is
// only known by asking. The API shape used here:
//
//   - wxpusher.zjiecode.com/docs/api-reference.html: "the returned
//     sendRecordId can be used to query the send status of a single
//     target"; the default call limit is about 2 QPS per app.
//   - The path GET /api/send/query/status?sendRecordId=<id> is the issue's
//     (kept about 7 days). WxPusher's SDKs (github.com/wxpusher/
//     wxpusher-client go/wxpusher/{api,result}.go, ouranoshong/
//     wxpusher-sdk-go api.go) call the older GET /api/send/query/<messageId>
//     and read the envelope every WxPusher answer has:
//     {"code":1000,"msg":..,"data":..,"success":true}, data there being a
//     bare number.
//   - What data holds for a sendRecordId is not in anything found; this
//     poller reads data.status (a string, or a number) and data.statusDesc
//     and maps the words: fail/失败/拒/block/unsubscribe are undelivered,
//     success/deliver/成功/送达 delivered, anything else (sending, pending,
//     待发送, a number) still pending. A code other than 1000 whose msg says
//     the record does not exist (不存在, not found, not exist) is "not yet
//     known": polled again, as is any error; code 1008 or a msg about the
//     call rate, and HTTP 429, slow it down.
//   - appToken is sent as a query parameter, as WxPusher's other GET
//     endpoints take it (/api/fun/wxuser), so the call counts against the
//     app it belongs to.
//
// Where the ids come from: the durable consumer "feedback-wxpusher" reads
// the sent events of EVENTS (a restart loses none: the server keeps which
// are settled) and keeps each WxPusher send unacknowledged, handed back
// with NakWithDelay, until a final status is stored as a receipt in
// RECEIPTS (source wxpusher, the processor makes the event) or
// WxPusherPollFor has passed. MaxAckPending (WxPusherMaxPending) bounds how
// many wait at once; newer sends wait in EVENTS meanwhile. Queries are
// paced per app (appToken) by a token bucket of WxPusherRate per second,
// burst one.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/metrics"
	"github.com/broadcastd/broadcast/shared"
)

const (
	// wxConcurrency is how many sends the poller handles at once; the
	// per-app pacing, not this, bounds the calls.
	wxConcurrency = 16
	// wxMaxPaceWait is the longest a handler waits for its app's next
	// call slot; a longer wait hands the send back for that long instead.
	wxMaxPaceWait = 2 * time.Second
	// wxMaxAnswer bounds the status answer read.
	wxMaxAnswer = 64 << 10
	// wxMaxRecordID bounds a sendRecordId (they are decimal numbers).
	wxMaxRecordID = 40
	wxStatusPath  = "/api/send/query/status"
)

// wxPoller holds the per-app pacing and the HTTP client.
type wxPoller struct {
	rate   rate.Limit
	client *http.Client

	mu   sync.Mutex
	apps map[string]*rate.Limiter // hash of the appToken -> its pace
}

func newWxPoller(perSec float64) *wxPoller {
	return &wxPoller{rate: rate.Limit(perSec), apps: map[string]*rate.Limiter{},
		client: &http.Client{Timeout: 10 * time.Second,
			// A redirect could carry the appToken elsewhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// limiter is the pace of the app whose appToken is token. The map holds
// one entry per distinct token the accounts name, keyed by its hash.
func (p *wxPoller) limiter(token string) *rate.Limiter {
	k := hashHex("wxpusher", token)
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.apps[k]
	if !ok {
		l = rate.NewLimiter(p.rate, 1)
		p.apps[k] = l
	}
	return l
}

// wxConsumerConfig reads every sent event, from the oldest WxPusher may
// still report on.
func wxConsumerConfig(cfg *Config) jetstream.ConsumerConfig {
	start := time.Now().Add(-cfg.WxPusherPollFor)
	return jetstream.ConsumerConfig{
		Durable:       contract.ConsumerFeedbackWxPusher,
		Description:   "feedback: polls the delivery status of WxPusher sends",
		FilterSubject: contract.SubjectEventsPrefix + "*." + string(contract.EventSent),
		DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime:  &start,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       10 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: cfg.WxPusherMaxPending,
	}
}

// wxConsumer returns the poller's consumer, creating it when missing (an
// existing one keeps its start).
func (s *Service) wxConsumer(ctx context.Context) (jetstream.Consumer, error) {
	cons, err := s.js.Consumer(ctx, contract.StreamEvents, contract.ConsumerFeedbackWxPusher)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return s.js.CreateConsumer(ctx, contract.StreamEvents, wxConsumerConfig(&s.cfg))
	}
	return cons, err
}

// wxState is what a status answer says.
type wxState int

const (
	wxPending     wxState = iota // not final yet, or not known yet: ask again
	wxDelivered                  // final: arrived
	wxFailed                     // final: will not arrive
	wxRateLimited                // the app's call rate was exceeded: ask later
	wxError                      // the call failed: ask again later
)

// wxStatus is a parsed status answer. Code and Reason are the provider's
// words, clipped; they never hold the appToken.
type wxStatus struct {
	State        wxState
	Code, Reason string
}

// wxStatusAnswer is the envelope of a status answer.
type wxStatusAnswer struct {
	Code    int             `json:"code"`
	Msg     string          `json:"msg"`
	Success bool            `json:"success"`
	Data    json.RawMessage `json:"data"`
}

// wxStatusData is data of a status answer, as far as it is read.
type wxStatusData struct {
	Status     json.RawMessage `json:"status"`
	StatusDesc string          `json:"statusDesc"`
}

// parseWxStatus reads a status answer of HTTP status code.
func parseWxStatus(code int, body []byte) wxStatus {
	if code == http.StatusTooManyRequests {
		return wxStatus{State: wxRateLimited, Code: "429"}
	}
	if code < 200 || code >= 300 {
		return wxStatus{State: wxError, Code: strconv.Itoa(code), Reason: clip(strings.TrimSpace(string(body)), 200)}
	}
	var a wxStatusAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return wxStatus{State: wxError, Code: "decode", Reason: clip(err.Error(), 200)}
	}
	msg := strings.ToLower(a.Msg)
	if a.Code != 1000 {
		c := strconv.Itoa(a.Code)
		switch {
		case a.Code == 1008 || hasAny(msg, "频率", "频繁", "限流", "too frequent", "too many", "rate limit"):
			return wxStatus{State: wxRateLimited, Code: c, Reason: clip(a.Msg, 200)}
		case hasAny(msg, "不存在", "not found", "not exist", "未找到"):
			return wxStatus{State: wxPending, Code: c, Reason: clip(a.Msg, 200)}
		}
		return wxStatus{State: wxError, Code: c, Reason: clip(a.Msg, 200)}
	}
	var d wxStatusData
	var status string
	if json.Unmarshal(a.Data, &d) == nil && len(d.Status) > 0 {
		if json.Unmarshal(d.Status, &status) != nil {
			status = strings.TrimSpace(string(d.Status)) // a number
		}
	} else {
		status = strings.TrimSpace(string(a.Data)) // bare number, null, or nothing
	}
	if status == "null" {
		status = ""
	}
	reason := d.StatusDesc
	if reason == "" {
		reason = status
	}
	st := wxStatus{State: wxPending, Code: clip(status, 64), Reason: clip(reason, maxErrorBytes)}
	words := strings.ToLower(status + " " + d.StatusDesc)
	switch {
	// Failure words first: "发送失败" holds "发送" as "发送成功" does.
	case hasAny(words, "fail", "失败", "拒", "block", "unsubscri", "reject", "error"):
		st.State = wxFailed
	case hasAny(words, "success", "deliver", "成功", "送达"):
		st.State = wxDelivered
	}
	return st
}

func hasAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// validRecordID reports whether id can be a sendRecordId: short, digits,
// letters, '-' and '_' only (it goes into a query string).
func validRecordID(id string) bool {
	if id == "" || len(id) > wxMaxRecordID {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// wxBase is the account's WxPusher base URL. The query carries the
// appToken, so it needs https except to a loopback host, as dispatch
// requires of the same endpoint (channels/adapter.go baseURL).
func wxBase(acct *contract.Account) (string, error) {
	ep := acct.Endpoint
	if ep == "" {
		ep = channels.WxPusherDefaultEndpoint
	}
	u, err := url.Parse(ep)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
		return "", errors.New("endpoint: not an http(s) base URL")
	}
	if u.Scheme != "https" && !channels.IsLoopbackHost(u.Hostname()) {
		return "", errors.New("endpoint: must use https (the query carries the appToken)")
	}
	return strings.TrimRight(ep, "/"), nil
}

// query asks WxPusher for the status of sendRecordId id. The appToken
// never appears in what it returns.
func (p *wxPoller) query(ctx context.Context, base, token, id string) wxStatus {
	q := url.Values{"sendRecordId": {id}, "appToken": {token}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+wxStatusPath+"?"+q.Encode(), nil)
	if err != nil {
		return wxStatus{State: wxError, Code: "request"}
	}
	resp, err := p.client.Do(req)
	if err != nil {
		// url.Error names the URL, which holds the appToken: keep the cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return wxStatus{State: wxError, Code: "network", Reason: redactToken(clip(err.Error(), 200), token)}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, wxMaxAnswer))
	st := parseWxStatus(resp.StatusCode, body)
	st.Code, st.Reason = redactToken(st.Code, token), redactToken(st.Reason, token)
	return st
}

func redactToken(s, token string) string {
	if token == "" {
		return s
	}
	return strings.ReplaceAll(s, token, "[redacted]")
}

// nextPoll is the delay before the next query of a send of age: the age
// again (so queries come at 1, 2, 4, 8... times the first delay), between
// WxPusherFirstPoll and WxPusherMaxPollDelay, and never past the end of
// polling (the send is then given up when it comes back).
func (s *Service) nextPoll(age time.Duration) time.Duration {
	d := min(max(age, s.cfg.WxPusherFirstPoll), s.cfg.WxPusherMaxPollDelay)
	if left := s.cfg.WxPusherPollFor - age; left > 0 && d > left {
		d = left + time.Second
	}
	return d
}

// pollSent handles a sent event of the poller's consumer: other channels'
// sends are acknowledged at once; a WxPusher send is queried when due and
// handed back until its status is final and stored, or it is too old.
func (s *Service) pollSent(ctx context.Context, m jetstream.Msg) error {
	var ev contract.Event
	if err := contract.DecodeEvent(m.Data(), &ev); err != nil || ev.Kind != contract.EventSent ||
		!contract.ValidID(ev.TaskID) || !contract.ValidID(ev.Account) {
		return nil // the index consumer logs undecodable sent events
	}
	acct := s.accounts.aw.Get(ev.Account)
	if acct == nil || acct.Channel != "wxpusher" || ev.ProviderID == "" {
		return nil
	}
	log := s.log.With(shared.KeyAccount, ev.Account, "task", ev.TaskID, "index", ev.Index)
	if !validRecordID(ev.ProviderID) {
		log.Warn("WxPusher send has no usable sendRecordId; not polled", "len", len(ev.ProviderID))
		return nil
	}
	meta, err := m.Metadata()
	if err != nil {
		return shared.RetryAfter(time.Second, err)
	}
	age := time.Since(meta.Timestamp)
	if age >= s.cfg.WxPusherPollFor {
		s.cfg.metrics.Receipt(SourceWxPusher, metrics.ReceiptIgnored, 1)
		log.Info("WxPusher send reached no final status in time; no longer polled", "sent", meta.Timestamp)
		return nil
	}
	if age < s.cfg.WxPusherFirstPoll {
		return shared.RetryAfter(s.cfg.WxPusherFirstPoll-age, errors.New("not due"))
	}
	base, err := wxBase(acct)
	if err != nil {
		log.Warn("WxPusher account cannot be polled", "err", err)
		return shared.RetryAfter(s.cfg.WxPusherMaxPollDelay, err)
	}
	tok, err := s.accounts.secret("secret_env", acct.SecretEnv)
	if err != nil {
		log.Warn("WxPusher account cannot be polled", "err", err)
		return shared.RetryAfter(s.cfg.WxPusherMaxPollDelay, err)
	}
	token := string(tok)

	// Wait for the app's next call slot, or come back when it is due.
	r := s.wx.limiter(token).Reserve()
	if d := r.Delay(); d > wxMaxPaceWait {
		r.Cancel()
		return shared.RetryAfter(d+rand.N(time.Second), errors.New("app's call budget is spent for now"))
	} else if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return shared.RetryAfter(time.Second, ctx.Err())
		case <-t.C:
		}
	}
	st := s.wx.query(ctx, base, token, ev.ProviderID)
	s.polls.Add(1)

	switch st.State {
	case wxDelivered, wxFailed:
		return s.storeWxReceipt(ctx, &ev, st)
	case wxRateLimited:
		log.Warn("WxPusher says the app's call rate is exceeded; slowing down", "code", st.Code)
		return shared.RetryAfter(max(s.nextPoll(age), 10*time.Second), errors.New("rate limited"))
	case wxError:
		log.Debug("WxPusher status query failed; will ask again", "code", st.Code, "err", st.Reason)
	}
	return shared.RetryAfter(s.nextPoll(age), errors.New("status not final"))
}

// storeWxReceipt stores a final status in RECEIPTS like a webhook's
// receipt, keyed by account and sendRecordId, so a send queried twice (a
// restart between storing and acknowledging) is one receipt.
func (s *Service) storeWxReceipt(ctx context.Context, ev *contract.Event, st wxStatus) error {
	now := time.Now().UTC()
	rc := Receipt{Source: SourceWxPusher, Account: ev.Account, ID: ev.ProviderID, Status: StatusDelivered,
		At: now, Received: now}
	if st.State == wxFailed {
		rc.Status, rc.Code, rc.Error = StatusFailed, st.Code, st.Reason
	}
	data, err := json.Marshal(&rc)
	if err != nil {
		return shared.Permanent(err)
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	if _, err := s.js.Publish(pctx, contract.ReceiptSubject(rc.Source, rc.Account), data, jetstream.WithMsgID(rc.msgID())); err != nil {
		return shared.RetryAfter(time.Second, fmt.Errorf("store WxPusher receipt: %w", err))
	}
	s.cfg.metrics.Receipt(SourceWxPusher, metrics.ReceiptStored, 1)
	s.stored.Add(1)
	return nil
}
