package feedback

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
)

func TestWxPusherParseStatus(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		http  int
		body  string
		state wxState
		code  string
	}{
		{"delivered", 200, `{"code":1000,"msg":"处理成功","data":{"sendRecordId":1,"status":"success","statusDesc":"发送成功"},"success":true}`, wxDelivered, "success"},
		{"delivered in words", 200, `{"code":1000,"data":{"status":"已送达"},"success":true}`, wxDelivered, "已送达"},
		{"failed", 200, `{"code":1000,"data":{"status":"failed","statusDesc":"发送失败:用户已取消关注"},"success":true}`, wxFailed, "failed"},
		{"failure wins over the shared word", 200, `{"code":1000,"data":{"status":"发送失败"},"success":true}`, wxFailed, "发送失败"},
		{"pending", 200, `{"code":1000,"data":{"status":"sending","statusDesc":"发送中"},"success":true}`, wxPending, "sending"},
		{"numeric status is not final", 200, `{"code":1000,"data":{"status":2},"success":true}`, wxPending, "2"},
		{"bare number, as the old query answered", 200, `{"code":1000,"msg":"处理成功","data":3,"success":true}`, wxPending, "3"},
		{"null data", 200, `{"code":1000,"data":null,"success":true}`, wxPending, ""},
		{"not known yet", 200, `{"code":1004,"msg":"发送记录不存在","data":null,"success":false}`, wxPending, "1004"},
		{"call rate by code", 200, `{"code":1008,"msg":"x"}`, wxRateLimited, "1008"},
		{"call rate by msg", 200, `{"code":1099,"msg":"请求过于频繁"}`, wxRateLimited, "1099"},
		{"HTTP 429", 429, ``, wxRateLimited, "429"},
		{"token wrong", 200, `{"code":1001,"msg":"appToken错误"}`, wxError, "1001"},
		{"server error", 502, `bad gateway`, wxError, "502"},
		{"not JSON", 200, `<html>`, wxError, "decode"},
		{"empty", 200, ``, wxError, "decode"},
		{"status of the wrong type", 200, `{"code":1000,"data":{"status":{"a":1}}}`, wxPending, `{"a":1}`},
	} {
		st := parseWxStatus(c.http, []byte(c.body))
		require.Equal(t, c.state, st.State, c.name)
		require.Equal(t, c.code, st.Code, c.name)
	}
	long := `{"code":1000,"data":{"status":"failed","statusDesc":"` + strings.Repeat("长", 1000) + `"}}`
	require.LessOrEqual(t, len(parseWxStatus(200, []byte(long)).Reason), maxErrorBytes, "reasons are clipped")
}

func TestWxPusherQueryStandIn(t *testing.T) {
	t.Parallel()
	const token = "AT_unit-secret-token"
	plan := map[string][]feedbacktest.WxAnswer{
		"UID_a": {feedbacktest.WxNotKnown, feedbacktest.WxPending, feedbacktest.WxDelivered},
		"UID_b": {feedbacktest.WxFailed},
	}
	wx := feedbacktest.StartWxPusher(token, func(uid string) []feedbacktest.WxAnswer { return plan[uid] })
	defer wx.Close()
	res, err := http.Post(wx.URL+"/api/send/message", "application/json",
		strings.NewReader(`{"appToken":"`+token+`","content":"hi","uids":["UID_a","UID_b"]}`))
	require.NoError(t, err)
	res.Body.Close()

	p := newWxPoller(100)
	ctx := context.Background()
	var got []wxState
	for range 4 {
		got = append(got, p.query(ctx, wx.URL, token, "880001").State)
	}
	require.Equal(t, []wxState{wxPending, wxPending, wxDelivered, wxDelivered}, got, "not known, pending, then delivered")
	st := p.query(ctx, wx.URL, token, "880002")
	require.Equal(t, wxFailed, st.State)
	require.Equal(t, "发送失败:用户已取消关注", st.Reason)
	require.Equal(t, wxError, p.query(ctx, wx.URL, "AT_wrong", "880002").State)
	require.Equal(t, 1, wx.Refused())

	// A call that fails names no appToken.
	wx.Close()
	st = p.query(ctx, wx.URL, token, "880001")
	require.Equal(t, wxError, st.State)
	require.NotEmpty(t, st.Reason)
	require.NotContains(t, st.Reason, token)
}

func TestWxPusherPacesPerApp(t *testing.T) {
	t.Parallel()
	p := newWxPoller(2)
	a, b := p.limiter("AT_one"), p.limiter("AT_two")
	require.Same(t, a, p.limiter("AT_one"), "accounts sharing an appToken share its pace")
	require.NotSame(t, a, b)
	require.True(t, a.Allow())
	require.False(t, a.Allow(), "burst of one")
	require.True(t, b.Allow(), "another app has its own budget")
	for k := range p.apps {
		require.NotContains(t, k, "AT_", "the map keys are hashes")
	}
}

func TestWxPusherNextPoll(t *testing.T) {
	t.Parallel()
	s := &Service{cfg: Config{WxPusherFirstPoll: 30 * time.Second, WxPusherMaxPollDelay: 30 * time.Minute, WxPusherPollFor: 7 * 24 * time.Hour}}
	require.Equal(t, 30*time.Second, s.nextPoll(0))
	require.Equal(t, 30*time.Second, s.nextPoll(30*time.Second), "second query at 1 minute")
	require.Equal(t, 4*time.Minute, s.nextPoll(4*time.Minute), "doubling the age")
	require.Equal(t, 30*time.Minute, s.nextPoll(10*time.Hour), "capped")
	require.Equal(t, 11*time.Second, s.nextPoll(7*24*time.Hour-10*time.Second), "comes back just after the end, to be given up")
	for _, id := range []string{"", "12 3", "1&appToken=x", strings.Repeat("9", 41)} {
		require.False(t, validRecordID(id), id)
	}
	require.True(t, validRecordID("880001"))
	for ep, ok := range map[string]bool{"": true, "https://wx.example/": true, "http://127.0.0.1:9": true,
		"http://wx.example": false, "ftp://wx.example": false, "https://wx.example/?a=b": false, "::": false} {
		base, err := wxBase(&contract.Account{Endpoint: ep})
		require.Equal(t, ok, err == nil, "%q: %v", ep, err)
		if ok {
			require.False(t, strings.HasSuffix(base, "/"), base)
		}
	}
}

// FuzzWxPusherParseStatus: no answer crashes the parser, and what it
// keeps stays within its bounds.
func FuzzWxPusherParseStatus(f *testing.F) {
	for _, s := range []string{`{"code":1000,"data":{"status":"success"}}`, `{"code":1000,"data":3}`,
		`{"code":1004,"msg":"发送记录不存在"}`, `{"code":1000,"data":{"status":["x"],"statusDesc":7}}`, `null`, `[]`, "\xff"} {
		f.Add(200, []byte(s))
	}
	f.Fuzz(func(t *testing.T, code int, body []byte) {
		st := parseWxStatus(code, body)
		if st.State < wxPending || st.State > wxError {
			t.Fatalf("state %d", st.State)
		}
		if len(st.Code) > 64 || len(st.Reason) > maxErrorBytes {
			t.Fatalf("unbounded: %d %d", len(st.Code), len(st.Reason))
		}
	})
}
