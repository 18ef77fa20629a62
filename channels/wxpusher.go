package channels

// WxPusher channel: WeChat notifications through wxpusher.zjiecode.com.
//
// Account (KV broadcast_accounts):
//
//	{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_WXPUSHER_APP",
//	 "content_type":2,"url":"https://shop.example/orders",
//	 "rate_per_sec":2,"burst":1,"concurrency":1,"max_batch":2000}
//
//   - content_type (or contentType): 1 text (default), 2 HTML, 3 Markdown.
//     With 2, render HTML-escapes the recipient's variables (HTMLChannel).
//   - url: optional link opened from the message, under 400 characters.
//   - endpoint: defaults to https://wxpusher.zjiecode.com.
//   - timeout: per request. Defaults to 10s.
//
// WxPusher takes up to 2,000 uids per call and allows about 2 calls per
// second per app, so use rate_per_sec 2, concurrency 1 and max_batch 2000:
// dispatch (services/dispatch/batcher.go) merges the jobs of recipients
// whose rendered content is identical into one Send of up to max_batch
// messages, and for such an account rate_per_sec and concurrency count
// calls, not recipients. Each uid still gets its own Result, so results,
// retries and dead letters stay per recipient. A Send with more than 2,000
// messages is split into several calls.
//
// Environment: the variable named by secret_env holds the app's appToken
// ("AT_..."). It travels in the request body and is removed from any
// provider text copied into results.
//
// Recipients are WxPusher uids ("UID_" followed by up to 60 characters, no
// spaces). Bodies must be non-empty and at most 40,000 characters. The
// summary shown in the chat list is the body's first line, cut to 100
// characters (tags removed for HTML, heading marks for Markdown).
//
// Errors: the answer is {"code":1000,"msg":..,"data":[{"uid","code",
// "status","messageId","sendRecordId",..}],"success":true}.
//   - Top-level code other than 1000 fails the whole call: a msg about the
//     call rate (频率, 频繁, 限流, too frequent) or code 1008 is rate
//     limited; codes 1001 (appToken wrong), 1002 (unauthorised in
//     WxPusher's SDK), 1010 (caller IP not allow-listed) or a msg about the
//     appToken are account fatal; anything else is retryable. HTTP 429 is
//     rate limited (Retry-After honoured), 401/403 account fatal, 5xx and
//     network errors retryable, other 4xx permanent.
//   - Per uid: code 1000 is sent (ProviderID is the sendRecordId, which
//     identifies this recipient's delivery, or messageId when absent);
//     1005/1006/1007/1009 (server, WeChat, network, unknown errors in
//     WxPusher's SDK) are retryable; any other code, such as a uid that is
//     invalid or no longer follows the app, is permanent; a uid missing
//     from the answer is retryable.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/broadcastd/broadcast/contract"
)

// WxPusher limits.
const (
	WxPusherDefaultEndpoint = "https://wxpusher.zjiecode.com"
	// WxPusherMaxUIDs is how many uids one call may carry.
	WxPusherMaxUIDs = 2000
	// WxPusherMaxContent is the content limit in characters.
	WxPusherMaxContent = 40_000
	// WxPusherMaxSummary is the summary limit in characters.
	WxPusherMaxSummary = 100
	// WxPusherMaxUID bounds a uid's length; real ones are about 32.
	WxPusherMaxUID = 64
	wxpusherMaxURL = 400
	wxpusherOK     = 1000
)

// WxPusher sends WeChat notifications through WxPusher.
type WxPusher struct {
	// Net is where its requests may go. Defaults to anywhere.
	Net NetPolicy
}

// Name implements Channel.
func (WxPusher) Name() string { return "wxpusher" }

// MaxBatch implements BatchChannel.
func (WxPusher) MaxBatch() int { return WxPusherMaxUIDs }

// NormalizeRecipient checks that to looks like a WxPusher uid.
func (WxPusher) NormalizeRecipient(to string) (string, error) {
	to = strings.TrimSpace(to)
	switch {
	case to == "":
		return "", errors.New("must not be empty")
	case strings.IndexFunc(to, unicode.IsSpace) >= 0:
		return "", fmt.Errorf("WxPusher uid %q must not contain spaces", to)
	case len(to) > WxPusherMaxUID:
		return "", fmt.Errorf("WxPusher uid is %d bytes, limit is %d", len(to), WxPusherMaxUID)
	case !strings.HasPrefix(to, "UID_") || len(to) == len("UID_"):
		return "", fmt.Errorf("WxPusher uid %q must start with \"UID_\" (find it in the app's user list)", to)
	}
	return to, nil
}

// HTMLBody implements HTMLChannel: an account with content_type 2.
func (WxPusher) HTMLBody(acct *contract.Account) bool {
	var o wxpusherOptions
	if decodeOptions(acct, &o) != nil {
		return false
	}
	return o.ContentType == 2 || o.ContentType == 0 && o.ContentTypeAlt == 2
}

// CheckBody enforces WxPusher's content limit.
func (WxPusher) CheckBody(body string) error {
	if strings.TrimSpace(body) == "" {
		return errors.New("must not be empty")
	}
	if n := utf8.RuneCountInString(body); n > WxPusherMaxContent {
		return fmt.Errorf("is %d characters, WxPusher's limit is %d", n, WxPusherMaxContent)
	}
	return nil
}

// wxpusherOptions are the WxPusher-specific account fields.
type wxpusherOptions struct {
	ContentType int `json:"content_type"`
	// ContentTypeAlt is WxPusher's own spelling, accepted as well.
	ContentTypeAlt int               `json:"contentType"`
	URL            string            `json:"url"`
	Timeout        contract.Duration `json:"timeout"`
}

// NewSender implements Channel.
func (w WxPusher) NewSender(acct *contract.Account, getenv func(string) string) (Sender, error) {
	var o wxpusherOptions
	if err := decodeOptions(acct, &o); err != nil {
		return nil, err
	}
	ct := o.ContentType
	switch {
	case ct == 0:
		ct = o.ContentTypeAlt
	case o.ContentTypeAlt != 0 && o.ContentTypeAlt != ct:
		return nil, fmt.Errorf("content_type: %d contradicts contentType %d", ct, o.ContentTypeAlt)
	}
	if ct == 0 {
		ct = 1
	}
	if ct < 1 || ct > 3 {
		return nil, fmt.Errorf("content_type: want 1 (text), 2 (HTML) or 3 (Markdown), got %d", ct)
	}
	if o.URL != "" {
		if _, err := baseURL(o.URL, "", false); err != nil {
			return nil, fmt.Errorf("url: %q is not an http(s) URL", o.URL)
		}
		if n := utf8.RuneCountInString(o.URL); n >= wxpusherMaxURL {
			return nil, fmt.Errorf("url: is %d characters, WxPusher's limit is %d", n, wxpusherMaxURL-1)
		}
	}
	base, err := baseURL(acct.Endpoint, WxPusherDefaultEndpoint, true)
	if err != nil {
		return nil, err
	}
	token, err := secret(acct, getenv, true)
	if err != nil {
		return nil, err
	}
	timeout := requestTimeout(o.Timeout, 10*time.Second)
	return &wxpusherSender{
		url:         base + "/api/send/message",
		token:       token,
		contentType: ct,
		link:        o.URL,
		client:      newHTTPClient(acct, timeout, w.Net),
	}, nil
}

type wxpusherSender struct {
	url         string
	token       string
	contentType int
	link        string
	client      *http.Client
}

// wxpusherRequest is the body of POST /api/send/message.
type wxpusherRequest struct {
	AppToken    string   `json:"appToken"`
	Content     string   `json:"content"`
	Summary     string   `json:"summary"`
	ContentType int      `json:"contentType"`
	UIDs        []string `json:"uids"`
	URL         string   `json:"url,omitempty"`
	VerifyPay   bool     `json:"verifyPay"`
}

// wxpusherAnswer is WxPusher's reply; data has one entry per uid.
type wxpusherAnswer struct {
	Code    int    `json:"code"`
	Msg     string `json:"msg"`
	Success bool   `json:"success"`
	Data    []struct {
		UID          string      `json:"uid"`
		Code         int         `json:"code"`
		Status       string      `json:"status"`
		MessageID    json.Number `json:"messageId"`
		SendRecordID json.Number `json:"sendRecordId"`
	} `json:"data"`
}

// Send posts the messages in calls of at most WxPusherMaxUIDs uids. The
// messages share one body, so the first message's body is the content.
func (s *wxpusherSender) Send(ctx context.Context, msgs []Message) []Result {
	out := make([]Result, 0, len(msgs))
	for start := 0; start < len(msgs); start += WxPusherMaxUIDs {
		chunk := msgs[start:min(start+WxPusherMaxUIDs, len(msgs))]
		res := s.call(ctx, chunk)
		out = append(out, res...)
		// Whatever stops this call stops the rest; do not spend the app's
		// call budget on answers we already know.
		if allSame(res) && stopsAccount(res[0].Class) {
			out = append(out, Fail(len(msgs)-len(out), res[0])...)
			break
		}
	}
	return out
}

func allSame(rs []Result) bool {
	for _, r := range rs[1:] {
		if r.Class != rs[0].Class || r.Code != rs[0].Code {
			return false
		}
	}
	return true
}

func (s *wxpusherSender) call(ctx context.Context, msgs []Message) []Result {
	content := msgs[0].Body
	uids := make([]string, len(msgs))
	for i, m := range msgs {
		uids[i] = m.To
	}
	payload, err := json.Marshal(wxpusherRequest{
		AppToken: s.token, Content: content, Summary: WxPusherSummary(content, s.contentType),
		ContentType: s.contentType, UIDs: uids, URL: s.link,
	})
	if err != nil {
		return Fail(len(msgs), Result{Class: contract.ClassPermanent, Code: "encode", Err: err.Error()})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(payload))
	if err != nil {
		return Fail(len(msgs), Result{Class: contract.ClassPermanent, Code: "request", Err: clip(redact(errorText(err), s.token))})
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return Fail(len(msgs), networkResult(err, s.token))
	}
	defer resp.Body.Close()
	// 2,000 per-uid entries of ~150 bytes each fit well within 4 MiB.
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	var ans wxpusherAnswer
	parsed := json.Unmarshal(raw, &ans) == nil
	if resp.StatusCode < 200 || resp.StatusCode >= 300 || !parsed {
		return Fail(len(msgs), s.httpFailure(resp, raw, parsed, ans))
	}
	if ans.Code != wxpusherOK {
		r := Result{Class: classifyWxPusherCall(ans.Code, ans.Msg), Code: strconv.Itoa(ans.Code),
			Err: clip(redact(fmt.Sprintf("wxpusher %d: %s", ans.Code, ans.Msg), s.token))}
		return Fail(len(msgs), r)
	}
	return s.perUID(msgs, ans)
}

// httpFailure classifies a non-2xx or unreadable answer.
func (s *wxpusherSender) httpFailure(resp *http.Response, raw []byte, parsed bool, ans wxpusherAnswer) Result {
	r := Result{Code: strconv.Itoa(resp.StatusCode)}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		r.Class, r.Err = contract.ClassPermanent, "wxpusher: "+redirected(resp)
		return r
	}
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		// Accepted or not, we cannot tell; retrying may duplicate but
		// silently dropping loses.
		r.Class = contract.ClassRetryable
	case resp.StatusCode == http.StatusUnauthorized, resp.StatusCode == http.StatusForbidden:
		r.Class = contract.ClassAccountFatal
	default:
		r.Class = ClassifyHTTP(resp.StatusCode)
	}
	if parsed && ans.Msg != "" {
		r.Err = fmt.Sprintf("wxpusher: HTTP %d: %d %s", resp.StatusCode, ans.Code, ans.Msg)
	} else {
		r.Err = fmt.Sprintf("wxpusher: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	r.Err = clip(redact(r.Err, s.token))
	if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok && r.Class == contract.ClassRateLimited {
		r.RetryAfter = d
	}
	return r
}

// perUID maps the answer's per-uid entries back onto the messages.
func (s *wxpusherSender) perUID(msgs []Message, ans wxpusherAnswer) []Result {
	// A uid could in principle appear twice in one call; hand out its
	// entries in order.
	byUID := make(map[string][]int, len(ans.Data))
	for i, d := range ans.Data {
		byUID[d.UID] = append(byUID[d.UID], i)
	}
	out := make([]Result, len(msgs))
	for i, m := range msgs {
		idx := byUID[m.To]
		if len(idx) == 0 {
			out[i] = Result{Class: contract.ClassRetryable, Code: "missing",
				Err: "wxpusher: uid missing from the answer; delivery unknown"}
			continue
		}
		byUID[m.To] = idx[1:]
		d := ans.Data[idx[0]]
		r := Result{Code: strconv.Itoa(d.Code)}
		switch d.Code {
		case wxpusherOK:
			r.ProviderID = firstID(d.SendRecordID, d.MessageID)
		case 1005, 1006, 1007, 1009:
			r.Class = contract.ClassRetryable
		default:
			r.Class = contract.ClassPermanent
		}
		if r.Class != "" {
			r.Err = clip(redact(fmt.Sprintf("wxpusher %d: %s", d.Code, d.Status), s.token))
		}
		out[i] = r
	}
	return out
}

// firstID returns the first id that is present and not zero.
func firstID(ids ...json.Number) string {
	for _, id := range ids {
		if id != "" && id != "0" {
			return id.String()
		}
	}
	return ""
}

// classifyWxPusherCall maps a top-level WxPusher code other than 1000.
func classifyWxPusherCall(code int, msg string) contract.ErrorClass {
	lower := strings.ToLower(msg)
	switch {
	case code == 1008 || containsAny(lower, "频率", "频繁", "限流", "太快", "too frequent", "too many", "rate limit"):
		return contract.ClassRateLimited
	case code == 1001 || code == 1002 || code == 1010 || strings.Contains(lower, "token"):
		return contract.ClassAccountFatal
	}
	return contract.ClassRetryable
}

func containsAny(s string, subs ...string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// WxPusherSummary is the summary sent with content: its first non-blank
// line as text, cut to WxPusherMaxSummary characters.
func WxPusherSummary(content string, contentType int) string {
	if contentType == 2 {
		content = htmlToText(content)
	}
	for line := range strings.Lines(content) {
		line = strings.TrimSpace(line)
		if contentType == 3 {
			line = strings.TrimSpace(strings.TrimLeft(line, "#>*-+ "))
		}
		if line == "" {
			continue
		}
		if utf8.RuneCountInString(line) > WxPusherMaxSummary {
			line = string([]rune(line)[:WxPusherMaxSummary])
		}
		return line
	}
	return ""
}
