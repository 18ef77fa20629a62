package feedbacktest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"
)

// WxAnswer is what the WxPusher stand-in answers one status query with.
type WxAnswer string

// The stand-in's status answers. NotKnown is an error answer whose msg
// says the record does not exist (yet); the others answer code 1000 with
// data {"sendRecordId","uid","status","statusDesc"}.
const (
	WxNotKnown  WxAnswer = "not_known"
	WxPending   WxAnswer = "sending"
	WxDelivered WxAnswer = "success"
	WxFailed    WxAnswer = "failed"
)

// WxPusher is a stand-in for WxPusher's send API (POST /api/send/message:
// one sendRecordId per uid) and status API (GET /api/send/query/status
// ?sendRecordId=&appToken=). It records the time of every status query
// made with its appToken, to check the caller's pacing.
type WxPusher struct {
	*httptest.Server
	token string
	// plan gives each uid the answers its status queries get in order;
	// the last one repeats.
	plan func(uid string) []WxAnswer

	mu      sync.Mutex
	next    int
	records map[string]*wxRecord
	queries []time.Time
	refused int
}

type wxRecord struct {
	uid     string
	answers []WxAnswer
	asked   int
}

// StartWxPusher starts the stand-in; Close stops it.
func StartWxPusher(token string, plan func(uid string) []WxAnswer) *WxPusher {
	f := &WxPusher{token: token, plan: plan, next: 880000, records: map[string]*wxRecord{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/send/message", f.send)
	mux.HandleFunc("GET /api/send/query/status", f.status)
	f.Server = httptest.NewServer(mux)
	return f
}

func (f *WxPusher) send(w http.ResponseWriter, r *http.Request) {
	var req struct {
		AppToken string   `json:"appToken"`
		UIDs     []string `json:"uids"`
	}
	if json.NewDecoder(r.Body).Decode(&req) != nil || req.AppToken != f.token {
		fmt.Fprint(w, `{"code":1001,"msg":"appToken错误","data":null,"success":false}`)
		return
	}
	type entry struct {
		UID          string `json:"uid"`
		Code         int    `json:"code"`
		Status       string `json:"status"`
		MessageID    int    `json:"messageId"`
		SendRecordID int    `json:"sendRecordId"`
	}
	f.mu.Lock()
	data := make([]entry, len(req.UIDs))
	for i, u := range req.UIDs {
		f.next++
		f.records[strconv.Itoa(f.next)] = &wxRecord{uid: u, answers: f.plan(u)}
		data[i] = entry{UID: u, Code: 1000, Status: "创建发送任务成功", MessageID: 7, SendRecordID: f.next}
	}
	f.mu.Unlock()
	out, _ := json.Marshal(map[string]any{"code": 1000, "msg": "处理成功", "data": data, "success": true})
	_, _ = w.Write(out)
}

func (f *WxPusher) status(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("appToken") != f.token {
		f.mu.Lock()
		f.refused++
		f.mu.Unlock()
		fmt.Fprint(w, `{"code":1001,"msg":"appToken错误","data":null,"success":false}`)
		return
	}
	id := q.Get("sendRecordId")
	f.mu.Lock()
	f.queries = append(f.queries, time.Now())
	rec, ok := f.records[id]
	a := WxNotKnown
	if ok && len(rec.answers) > 0 {
		a = rec.answers[min(rec.asked, len(rec.answers)-1)]
		rec.asked++
	}
	f.mu.Unlock()
	if a == WxNotKnown {
		fmt.Fprint(w, `{"code":1004,"msg":"发送记录不存在","data":null,"success":false}`)
		return
	}
	desc := map[WxAnswer]string{WxPending: "发送中", WxDelivered: "发送成功", WxFailed: "发送失败:用户已取消关注"}[a]
	id64, _ := strconv.Atoi(id)
	out, _ := json.Marshal(map[string]any{"code": 1000, "msg": "处理成功", "success": true,
		"data": map[string]any{"sendRecordId": id64, "uid": rec.uid, "status": string(a), "statusDesc": desc}})
	_, _ = w.Write(out)
}

// Queries are the times of the status queries made with the right
// appToken, in order.
func (f *WxPusher) Queries() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.queries...)
}

// Refused is how many status queries had a wrong appToken.
func (f *WxPusher) Refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// Asked is how many status queries sendRecordIds of uid got.
func (f *WxPusher) Asked(uid string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.records {
		if r.uid == uid {
			n += r.asked
		}
	}
	return n
}

// MaxInWindow is the most status queries that arrived within any span
// shorter than window.
func MaxInWindow(times []time.Time, window time.Duration) int {
	best, lo := 0, 0
	for hi := range times {
		for times[hi].Sub(times[lo]) >= window {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// PerSecond counts the queries of each wall-clock second.
func PerSecond(times []time.Time) map[int64]int {
	out := map[int64]int{}
	for _, t := range times {
		out[t.Unix()]++
	}
	return out
}
