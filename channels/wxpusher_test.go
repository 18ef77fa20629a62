package channels

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

const wxToken = "AT_secretAppToken0123456789"

func wxAccount(t *testing.T, endpoint, extra string) *contract.Account {
	js := fmt.Sprintf(`{"channel":"wxpusher","endpoint":%q,"secret_env":"BROADCAST_SECRET_WX","max_batch":2000%s}`, endpoint, extra)
	return testAccount(t, js)
}

func wxSender(t *testing.T, acct *contract.Account) Sender {
	t.Helper()
	s, err := WxPusher{}.NewSender(acct, envWith("BROADCAST_SECRET_WX", wxToken))
	require.NoError(t, err)
	return s
}

func wxMsgs(n int, body string) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{ID: "t." + strconv.Itoa(i), TaskID: "t", To: "UID_" + strconv.Itoa(i), Body: body}
	}
	return msgs
}

// wxEntry is one per-uid entry of a WxPusher answer.
type wxEntry struct {
	UID              string `json:"uid"`
	TopicID          *int   `json:"topicId"`
	MessageID        int64  `json:"messageId"`
	MessageContentID int64  `json:"messageContentId"`
	SendRecordID     int64  `json:"sendRecordId"`
	Code             int    `json:"code"`
	Status           string `json:"status"`
}

func wxAnswer(entries []wxEntry) string {
	b, _ := json.Marshal(map[string]any{"code": 1000, "msg": "处理成功", "data": entries, "success": true})
	return string(b)
}

// wxEcho answers every uid of a request as sent, with sendRecordId 9000+n
// for "UID_n".
func wxEcho(w http.ResponseWriter, _ *http.Request, body []byte) {
	var req wxpusherRequest
	_ = json.Unmarshal(body, &req)
	entries := make([]wxEntry, len(req.UIDs))
	for i, uid := range req.UIDs {
		n, _ := strconv.Atoi(strings.TrimPrefix(uid, "UID_"))
		entries[i] = wxEntry{UID: uid, MessageID: 123, MessageContentID: 456, SendRecordID: int64(9000 + n), Code: 1000, Status: "创建发送任务成功"}
	}
	answer(http.StatusOK, wxAnswer(entries))(w, nil, nil)
}

func TestWxPusherNormalizeRecipient(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want, err string }{
		{in: "UID_xAbC123", want: "UID_xAbC123"},
		{in: "  UID_xAbC123\t", want: "UID_xAbC123"},
		{in: "", err: "must not be empty"},
		{in: "UID_ab cd", err: "must not contain spaces"},
		{in: "uid_abc", err: `must start with "UID_"`},
		{in: "xAbC123", err: `must start with "UID_"`},
		{in: "UID_", err: `must start with "UID_"`},
		{in: "UID_" + strings.Repeat("a", 61), err: "is 65 bytes, limit is 64"},
	}
	for _, tt := range tests {
		got, err := WxPusher{}.NormalizeRecipient(tt.in)
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, got)
	}
	_, err := WxPusher{}.NormalizeRecipient("UID_" + strings.Repeat("a", 60))
	require.NoError(t, err, "64 bytes is within the limit")
}

func TestWxPusherCheckBody(t *testing.T) {
	t.Parallel()
	require.NoError(t, WxPusher{}.CheckBody(strings.Repeat("消", WxPusherMaxContent)))
	require.ErrorContains(t, WxPusher{}.CheckBody(strings.Repeat("消", WxPusherMaxContent+1)), "is 40001 characters, WxPusher's limit is 40000")
	require.ErrorContains(t, WxPusher{}.CheckBody("\n "), "must not be empty")
}

func TestWxPusherSummary(t *testing.T) {
	t.Parallel()
	require.Equal(t, "服务器告警", WxPusherSummary("服务器告警\nCPU 使用率超过 90%", 1))
	require.Equal(t, "first", WxPusherSummary("\n\n  first  \nsecond", 1))
	require.Equal(t, strings.Repeat("长", 100), WxPusherSummary(strings.Repeat("长", 150)+"\nmore", 1))
	require.Equal(t, "Order #1 & more", WxPusherSummary("<h1 style=\"color:red\">Order #1 &amp; more</h1><p>details</p>", 2))
	require.Equal(t, "Heading", WxPusherSummary("## Heading\nbody", 3))
	require.Equal(t, "", WxPusherSummary("", 1))
}

func TestWxPusherNewSenderValidation(t *testing.T) {
	t.Parallel()
	env := envWith("BROADCAST_SECRET_WX", wxToken)
	tests := []struct{ account, err string }{
		{`{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_WX","content_type":4}`, "content_type: want 1 (text), 2 (HTML) or 3 (Markdown), got 4"},
		{`{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_WX","content_type":2,"contentType":3}`, "content_type: 2 contradicts contentType 3"},
		{`{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_WX","content_type":"html"}`, "content_type: must be int"},
		{`{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_WX","url":"javascript:alert(1)"}`, "url: "},
		{`{"channel":"wxpusher","secret_env":"BROADCAST_SECRET_WX","url":"https://x.example/` + strings.Repeat("a", 400) + `"}`, "url: is 418 characters, WxPusher's limit is 399"},
		{`{"channel":"wxpusher"}`, "secret_env: required"},
		{`{"channel":"wxpusher","secret_env":"NOPE"}`, "secret_env: environment variable NOPE is empty or unset"},
	}
	for _, tt := range tests {
		_, err := WxPusher{}.NewSender(testAccount(t, tt.account), env)
		require.ErrorContains(t, err, tt.err, tt.account)
	}
}

func TestWxPusherSendRequest(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answer(http.StatusOK, wxAnswer([]wxEntry{
		{UID: "UID_1", MessageID: 123, MessageContentID: 456, SendRecordID: 789, Code: 1000, Status: "创建发送任务成功"},
		{UID: "UID_0", MessageID: 123, MessageContentID: 456, SendRecordID: 788, Code: 1000, Status: "创建发送任务成功"},
	})))
	s := wxSender(t, wxAccount(t, fp.URL, `,"content_type":2,"url":"https://shop.example/orders"`))

	body := "<h1>Order shipped</h1><p>Your parcel is on its way.</p>"
	rs := s.Send(context.Background(), wxMsgs(2, body))

	require.Equal(t, []Result{{Code: "1000", ProviderID: "788"}, {Code: "1000", ProviderID: "789"}}, rs)
	reqs := fp.requests()
	require.Len(t, reqs, 1)
	require.Equal(t, http.MethodPost, reqs[0].Method)
	require.Equal(t, "/api/send/message", reqs[0].Path)
	require.Equal(t, "application/json", reqs[0].Header.Get("Content-Type"))
	require.JSONEq(t, `{"appToken":"`+wxToken+`","content":"<h1>Order shipped</h1><p>Your parcel is on its way.</p>",
		"summary":"Order shipped","contentType":2,"uids":["UID_0","UID_1"],"url":"https://shop.example/orders","verifyPay":false}`, string(reqs[0].Body))
}

func TestWxPusherDefaults(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, wxEcho)
	rs := wxSender(t, wxAccount(t, fp.URL, "")).Send(context.Background(), wxMsgs(1, "hello\nworld"))
	require.True(t, rs[0].OK())
	require.JSONEq(t, `{"appToken":"`+wxToken+`","content":"hello\nworld","summary":"hello","contentType":1,"uids":["UID_0"],"verifyPay":false}`,
		string(fp.requests()[0].Body))

	// WxPusher's own spelling of the field works too.
	fp = newFakeProvider(t, wxEcho)
	wxSender(t, wxAccount(t, fp.URL, `,"contentType":3`)).Send(context.Background(), wxMsgs(1, "# hi"))
	var req wxpusherRequest
	require.NoError(t, json.Unmarshal(fp.requests()[0].Body, &req))
	require.Equal(t, 3, req.ContentType)
}

func TestWxPusherBatching(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, wxEcho)
	msgs := wxMsgs(2500, "same content")

	rs := wxSender(t, wxAccount(t, fp.URL, "")).Send(context.Background(), msgs)

	reqs := fp.requests()
	require.Len(t, reqs, 2)
	var first, second wxpusherRequest
	require.NoError(t, json.Unmarshal(reqs[0].Body, &first))
	require.NoError(t, json.Unmarshal(reqs[1].Body, &second))
	require.Len(t, first.UIDs, 2000)
	require.Len(t, second.UIDs, 500)
	require.Equal(t, "UID_0", first.UIDs[0])
	require.Equal(t, "UID_1999", first.UIDs[1999])
	require.Equal(t, "UID_2000", second.UIDs[0])
	require.Equal(t, "UID_2499", second.UIDs[499])
	require.Len(t, rs, 2500)
	for i, r := range rs {
		require.True(t, r.OK(), "message %d: %+v", i, r)
		require.Equal(t, strconv.Itoa(9000+i), r.ProviderID, "message %d", i)
	}
}

func TestWxPusherPerUIDResults(t *testing.T) {
	t.Parallel()
	// Out of order, one uid missing, mixed outcomes.
	fp := newFakeProvider(t, answer(http.StatusOK, wxAnswer([]wxEntry{
		{UID: "UID_2", Code: 1006, Status: "和微信交互异常"},
		{UID: "UID_0", MessageID: 123, SendRecordID: 700, Code: 1000, Status: "创建发送任务成功"},
		{UID: "UID_1", Code: 1001, Status: "用户不存在或者已取消关注"},
		{UID: "UID_4", MessageID: 124, Code: 1000, Status: "创建发送任务成功"},
	})))

	rs := wxSender(t, wxAccount(t, fp.URL, "")).Send(context.Background(), wxMsgs(5, "x"))

	require.Len(t, rs, 5)
	require.Equal(t, Result{Code: "1000", ProviderID: "700"}, rs[0])
	require.Equal(t, contract.ClassPermanent, rs[1].Class)
	require.Equal(t, "1001", rs[1].Code)
	require.Contains(t, rs[1].Err, "用户不存在或者已取消关注")
	require.Equal(t, contract.ClassRetryable, rs[2].Class)
	require.Equal(t, "1006", rs[2].Code)
	require.Equal(t, contract.ClassRetryable, rs[3].Class)
	require.Equal(t, "missing", rs[3].Code)
	require.Equal(t, Result{Code: "1000", ProviderID: "124"}, rs[4], "messageId stands in when there is no sendRecordId")
}

func TestWxPusherCallErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		status     int
		body       string
		retryAfter string
		class      contract.ErrorClass
		code       string
		wait       time.Duration
	}{
		{"1001 appToken wrong", 200, `{"code":1001,"msg":"appToken不正确","data":null,"success":false}`, "", contract.ClassAccountFatal, "1001", 0},
		{"1002 unauthorised", 200, `{"code":1002,"msg":"未认证","data":null,"success":false}`, "", contract.ClassAccountFatal, "1002", 0},
		{"1002 about the call rate", 200, `{"code":1002,"msg":"发送频率过高，请稍后再试","data":null,"success":false}`, "", contract.ClassRateLimited, "1002", 0},
		{"1008 frequency", 200, `{"code":1008,"msg":"The API call frequency is too high","data":null,"success":false}`, "", contract.ClassRateLimited, "1008", 0},
		{"1010 IP not allowed", 200, `{"code":1010,"msg":"IP不在白名单","data":null,"success":false}`, "", contract.ClassAccountFatal, "1010", 0},
		{"token echoed", 200, `{"code":1001,"msg":"appToken ` + wxToken + ` 无效","data":null,"success":false}`, "", contract.ClassAccountFatal, "1001", 0},
		{"1005 server exception", 200, `{"code":1005,"msg":"接口 [/api/send/message] 出现异常","data":null,"success":false}`, "", contract.ClassRetryable, "1005", 0},
		{"HTTP 429", 429, `{"code":1008,"msg":"too many requests"}`, "2", contract.ClassRateLimited, "429", 2 * time.Second},
		{"HTTP 502", 502, `<html>Bad Gateway</html>`, "", contract.ClassRetryable, "502", 0},
		{"HTTP 401", 401, ``, "", contract.ClassAccountFatal, "401", 0},
		{"HTTP 400", 400, `{"code":1003,"msg":"bad request"}`, "", contract.ClassPermanent, "400", 0},
		{"HTTP 200 not JSON", 200, `<html>maintenance</html>`, "", contract.ClassRetryable, "200", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fp := newFakeProvider(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			})
			rs := wxSender(t, wxAccount(t, fp.URL, "")).Send(context.Background(), wxMsgs(3, "x"))
			require.Len(t, rs, 3)
			for _, r := range rs {
				require.Equal(t, tt.class, r.Class)
				require.Equal(t, tt.code, r.Code)
				require.Equal(t, tt.wait, r.RetryAfter)
				require.NotEmpty(t, r.Err)
			}
			requireNoSecret(t, rs, wxToken)
		})
	}
}

func TestWxPusherBatchStopsOnAccountAnswer(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answer(http.StatusOK, `{"code":1001,"msg":"appToken不正确","data":null,"success":false}`))
	rs := wxSender(t, wxAccount(t, fp.URL, "")).Send(context.Background(), wxMsgs(2500, "x"))
	require.Len(t, fp.requests(), 1, "the second call would get the same answer")
	require.Len(t, rs, 2500)
	for _, r := range rs {
		require.Equal(t, contract.ClassAccountFatal, r.Class)
	}
}

func TestWxPusherNetworkError(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, wxEcho)
	url := fp.URL
	fp.Close()
	rs := wxSender(t, wxAccount(t, url, "")).Send(context.Background(), wxMsgs(2, "x"))
	for _, r := range rs {
		require.Equal(t, contract.ClassRetryable, r.Class)
		require.Equal(t, "network", r.Code)
	}
	requireNoSecret(t, rs, wxToken)
}

func FuzzWxPusherNormalizeRecipient(f *testing.F) {
	for _, s := range []string{"UID_abc", " UID_x ", "UID_", "uid_x", "UID_a\u00a0b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := WxPusher{}.NormalizeRecipient(in)
		if err != nil {
			return
		}
		again, err := WxPusher{}.NormalizeRecipient(out)
		require.NoError(t, err)
		require.Equal(t, out, again)
		require.True(t, strings.HasPrefix(out, "UID_"))
		require.LessOrEqual(t, len(out), WxPusherMaxUID)
	})
}
