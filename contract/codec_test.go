package contract

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func codecSampleJob() *Job {
	return &Job{ID: "t1.42", TaskID: "t1", Index: 42, To: "+8613000000042",
		Body: "héllo \u2028 <b>&amp;</b> \xff", Channel: "sandbox", Account: "a", Priority: PriorityHigh,
		MaxAttempts: 5, EnqueuedAt: time.Date(2026, 11, 30, 6, 35, 2, 531992065, time.UTC),
		Vars: map[string]any{"b": 1.5, "a": "x<y>&", "c": []any{1.0, "2", nil, map[string]any{"d": true}}},
		Pool: []string{"a", "b"}, Recheck: true}
}

// TestCodecMatchesEncodingJSON: the fast encoder writes exactly what
// encoding/json writes (zero times left out, HTML escaped, invalid UTF-8
// replaced, floats formatted alike), and both decoders read it back alike.
func TestCodecMatchesEncodingJSON(t *testing.T) {
	job := codecSampleJob()
	want, err := json.Marshal(job)
	require.NoError(t, err)
	got, err := EncodeJob(job)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
	require.NotContains(t, string(got), "expires_at")

	ev := &Event{TaskID: "t1", JobID: "t1.42", To: "+1", Account: "a", Kind: EventSent, Attempt: 2,
		At: time.Date(2026, 11, 30, 6, 35, 2, 5, time.FixedZone("x", 3600)), Index: 42,
		RatePerSec: 1e21, LatencyMS: 0.000123, Error: "\x00\x1f\"\\", CallShared: true}
	want, err = json.Marshal(ev)
	require.NoError(t, err)
	got, err = EncodeEvent(ev)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))

	b := &RenderBatch{TaskID: "t1", First: 7, Resumed: true, Recipients: []BatchRecipient{
		{To: "li@example.com", Vars: map[string]any{"n": 1e21, "s": "<&>\xff\u2028", "l": []any{nil, false}}},
		{To: "x y", Invalid: "not an email address"}}}
	wantB, err := json.Marshal(b)
	require.NoError(t, err)
	gotB, err := EncodeRenderBatch(b)
	require.NoError(t, err)
	require.Equal(t, string(wantB), string(gotB))
	var b1, b2 RenderBatch
	require.NoError(t, json.Unmarshal(wantB, &b1))
	require.NoError(t, DecodeRenderBatch(gotB, &b2))
	require.Equal(t, b1, b2)

	var j1, j2 Job
	require.NoError(t, json.Unmarshal(want, &j1))
	require.NoError(t, DecodeJob(want, &j2))
	require.Equal(t, j1, j2)
	var e1, e2 Event
	require.NoError(t, json.Unmarshal(got, &e1))
	require.NoError(t, DecodeEvent(got, &e2))
	require.Equal(t, e1, e2)
}

// TestCodecErrorsAreEncodingJSONs: what the fast decoder rejects is
// reported with encoding/json's own error.
func TestCodecErrorsAreEncodingJSONs(t *testing.T) {
	for _, in := range []string{`{"index":"x"}`, `{"id":`, `[1]`, ``} {
		var want Job
		werr := json.Unmarshal([]byte(in), &want)
		require.Error(t, werr, in)
		var got Job
		gerr := DecodeJob([]byte(in), &got)
		require.Error(t, gerr, in)
		require.Equal(t, werr.Error(), gerr.Error(), in)
	}
}

// FuzzCodecMatchesEncodingJSON: on any input, DecodeJob, DecodeEvent,
// DecodeRecipient and DecodeRenderBatch succeed exactly when
// encoding/json does, with the same value.
func FuzzCodecMatchesEncodingJSON(f *testing.F) {
	sample, _ := json.Marshal(codecSampleJob())
	f.Add(sample)
	f.Add([]byte(`{"task_id":"t","job_id":"t.1","kind":"sent","index":1,"at":"2026-11-30T06:35:02Z","rate_per_sec":5}`))
	f.Add([]byte(`{"id":"a\u00e9\ud800","vars":{"x":[1,{"y":null}]},"index":-3,"ID":"b","Index":2}`))
	f.Add([]byte(`{"id":"t1","channel":"webhook","template":"Hi {{.name}}","recipients":[{"to":"+8613800000001","vars":{"name":"Li","n":1.5e3}},"+8613800000002"],"priority":"high","send_at":"2026-12-01T08:00:00Z"}`))
	f.Add([]byte(`{"ID":"t1","Channel":"x","recipients":[]} {}`))
	f.Add([]byte(`{"id":"t1","bogus":1}`))
	f.Add([]byte(`{"id":"t1","recipients":[{"to":1}],"defaults":{"a":[null,true,"\u00e9"]}}`))
	f.Add([]byte(`{"to":"li@example.com","vars":{"name":"Li","n":3,"x":{"y":[1,"\ud800"]}},"TO":"x","extra":1}`))
	f.Add([]byte(`{"task_id":"t1","first":3,"recipients":[{"to":"a@b","vars":{"k":"v"}},{"to":"bad","invalid":"why"}],"resumed":true}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		decodesAlike(t, "job", in, DecodeJob)
		decodesAlike(t, "event", in, DecodeEvent)
		decodesAlike(t, "recipient", in, DecodeRecipient)
		decodesAlike(t, "render batch", in, DecodeRenderBatch)
		t1, e1 := decodeTaskStd(in)
		t2, fast := decodeTaskFast(in)
		if fast && e1 != nil {
			t.Fatalf("task %q: encoding/json %v, go-json accepted it", in, e1)
		}
		if fast && !reflect.DeepEqual(t1, t2) {
			t.Fatalf("task %q decodes differently:\n%#v\n%#v", in, t1, t2)
		}
	})
}

// decodesAlike fails t unless decode and encoding/json both refuse in or
// both decode it to the same value.
func decodesAlike[T any](t *testing.T, what string, in []byte, decode func([]byte, *T) error) {
	t.Helper()
	var v1, v2 T
	e1, e2 := json.Unmarshal(in, &v1), decode(in, &v2)
	if (e1 == nil) != (e2 == nil) {
		t.Fatalf("%s %q: encoding/json %v, fast decoder %v", what, in, e1, e2)
	}
	if e1 == nil && !reflect.DeepEqual(v1, v2) {
		t.Fatalf("%s %q decodes differently:\n%#v\n%#v", what, in, v1, v2)
	}
}

// TestJobSetPool: a short accounts list is copied into the job; a long one
// is referred to, so the job's size does not grow with it.
func TestJobSetPool(t *testing.T) {
	var j Job
	short := []string{"a", "b"}
	j.SetPool(short)
	require.Equal(t, short, j.Pool)
	require.False(t, j.PoolInTask)
	long := make([]string, MaxJobPool+1)
	for i := range long {
		long[i] = "account-with-a-long-name-" + string(rune('a'+i))
	}
	j.SetPool(long)
	require.Nil(t, j.Pool)
	require.True(t, j.PoolInTask)
	data, err := EncodeJob(&j)
	require.NoError(t, err)
	require.Contains(t, string(data), `"pool_in_task":true`)
	require.NotContains(t, string(data), "account-with")
	j.SetPool(nil)
	require.False(t, j.PoolInTask)
}
