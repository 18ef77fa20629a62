package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestOperatorCommands: dead ls|show|retry, accounts and lookup read what
// the streams and buckets hold, as tables and as JSON, and name the bad
// argument.
func TestOperatorCommands(t *testing.T) {
	ts := topologytest.Start(t)
	ctx := t.Context()
	run := func(cmd string, args ...string) (string, error) {
		var out bytes.Buffer
		err := operatorCommand(ctx, ts.JS, cmd, args, &out)
		return out.String(), err
	}
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	var seqs []uint64
	for i, to := range []string{"bad-1", "bad-2", "bad-3"} {
		dl := contract.DeadLetter{Job: contract.Job{ID: "t1." + to, TaskID: "t1", To: to}, Account: "hook", Attempts: 2,
			Code: "400", Error: "HTTP 400: invalid recipient", At: at.Add(time.Duration(i) * time.Second),
			History: []contract.AttemptError{{Attempt: 1, Account: "hook", Code: "503", Error: "HTTP 503"}, {Attempt: 2, Account: "hook", Code: "400", Error: "HTTP 400: invalid recipient"}}}
		data, _ := json.Marshal(dl)
		ack, err := ts.JS.Publish(ctx, contract.DeadSubject("t1"), data)
		require.NoError(t, err)
		seqs = append(seqs, ack.Sequence)
	}
	out, err := run("dead", "ls", "-limit", "2", "t1")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out) // header, two letters, the range
	require.Contains(t, lines[1], "bad-1")
	require.Contains(t, lines[2], "bad-2")
	require.Equal(t, "1-2 of 3", strings.TrimSpace(lines[3]))

	out, err = run("dead", "ls", "-json", "-offset", "2", "t1")
	require.NoError(t, err)
	var page client.DeadPage
	require.NoError(t, json.Unmarshal([]byte(out), &page))
	require.Equal(t, 3, page.Total)
	require.Len(t, page.Letters, 1)
	require.Equal(t, "bad-3", page.Letters[0].To)
	require.Equal(t, seqs[2], page.Letters[0].Seq)
	require.Len(t, page.Letters[0].Attempts, 2)

	out, err = run("dead", "show", "t1", formatSeq(seqs[1]))
	require.NoError(t, err)
	require.Contains(t, out, "bad-2 via hook")
	require.Contains(t, out, "attempt 1")
	require.Contains(t, out, "503: HTTP 503")
	require.Contains(t, out, "400: HTTP 400: invalid recipient")
	_, err = run("dead", "show", "t2", formatSeq(seqs[1]))
	require.ErrorContains(t, err, "is not task t2's")

	// retry sends exactly the sequences given to broadcast.control.<task>.
	var got contract.ControlRequest
	sub, err := ts.NC.Subscribe(contract.ControlSubject("t1"), func(m *nats.Msg) {
		_ = json.Unmarshal(m.Data, &got)
		data, _ := json.Marshal(contract.ControlReply{OK: true, State: contract.StateProcessing, Requeued: len(got.Seqs)})
		_ = m.Respond(data)
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	out, err = run("dead", "retry", "-seqs", formatSeq(seqs[0])+","+formatSeq(seqs[2]), "t1")
	require.NoError(t, err)
	require.Equal(t, "re-queued 2 dead letters of t1\n", out)
	require.Equal(t, contract.ActionRetryDead, got.Action)
	require.Equal(t, []uint64{seqs[0], seqs[2]}, got.Seqs)

	for _, c := range []struct {
		cmd  string
		args string
		want string
	}{
		{"dead", "ls -limit 0 t1", "limit: must be 1 to 500"},
		{"dead", "ls", "TASK: give one task id"},
		{"dead", "ls bad.id", `task: "bad.id" must match`},
		{"dead", "show t1 x", `SEQ: "x" is not a sequence number`},
		{"dead", "retry -seqs 1,x t1", `-seqs: "x" is not a sequence number`},
		{"dead", "purge t1", `unknown subcommand "purge"`},
		{"lookup", "", "RECIPIENT: give one recipient"},
		{"accounts", "extra", "accounts takes no arguments"},
	} {
		_, err := run(c.cmd, strings.Fields(c.args)...)
		require.ErrorContains(t, err, c.want, c.cmd+" "+c.args)
	}

	// accounts: configuration and health together.
	putValue(t, ts.JS, contract.BucketAccounts, "hook", `{"channel":"webhook","endpoint":"http://127.0.0.1:1/x","rate_per_sec":50,"burst":1,"concurrency":1,"daily_cap":1000}`)
	putValue(t, ts.JS, contract.BucketAccounts, "wa", `{"channel":"whatsapp","rate_per_sec":-1}`)
	putValue(t, ts.JS, contract.BucketHealth, "hook", `{"state":"paused","reason":"token revoked","rate_per_sec":12.5,"ceiling":50,"daily_used":321,"daily_cap":1000}`)
	putValue(t, ts.JS, contract.BucketSignals, "hook", `{"quality":"YELLOW","at":"2026-12-02T08:00:00Z"}`)
	putValue(t, ts.JS, contract.BucketScores, "hook", `{"score":63,"window":"1h0m0s","sent":100,"at":"2026-12-02T08:00:00Z"}`)
	out, err = run("accounts", "-json")
	require.NoError(t, err)
	var accounts []client.AccountStatus
	require.NoError(t, json.Unmarshal([]byte(out), &accounts))
	require.Len(t, accounts, 2)
	require.Equal(t, client.AccountStatus{Name: "hook", Channel: "webhook", Enabled: true, State: "paused", Reason: "token revoked",
		RatePerSec: 12.5, Ceiling: 50, DailyUsed: 321, DailyCap: 1000, HealthAt: accounts[0].HealthAt,
		Quality: "YELLOW", Score: 63}, accounts[0])
	require.Contains(t, accounts[1].Invalid, "rate_per_sec")
	require.Equal(t, contract.QualityUnknown, accounts[1].Quality)
	require.Equal(t, -1, accounts[1].Score, "no score written yet")
	require.NotContains(t, out, "127.0.0.1:1", "no endpoint (it may carry a token)")
	out, err = run("accounts")
	require.NoError(t, err)
	require.Contains(t, out, "hook")
	require.Contains(t, out, "12.5")
	require.Contains(t, out, "321")
	require.Contains(t, out, "YELLOW")
	require.Contains(t, out, "63")

	// lookup: the recipient's subject in LOOKUP, found by its normalized form.
	hash := contract.RecipientHash("+8613800000001")
	for _, e := range []contract.LookupEntry{
		{TaskID: "t1", To: "+8613800000001", Account: "wa", Kind: contract.EventSent, At: at},
		{TaskID: "t2", To: "+8613800000001", Account: "wa", Kind: contract.EventFailed, Code: "131026", Error: "undeliverable", At: at.Add(time.Hour)},
	} {
		data, _ := json.Marshal(e)
		_, err := ts.JS.Publish(ctx, contract.LookupSubject(hash), data)
		require.NoError(t, err)
	}
	_, err = ts.JS.Publish(ctx, contract.LookupSubject(contract.RecipientHash("+8613800000002")), []byte(`{"task_id":"t3"}`))
	require.NoError(t, err)
	out, err = run("lookup", "-json", "+86 138 0000 0001")
	require.NoError(t, err)
	var found client.Lookup
	require.NoError(t, json.Unmarshal([]byte(out), &found))
	require.Equal(t, "+8613800000001", found.Normalized)
	require.Len(t, found.Entries, 2, "only this recipient's entries")
	require.Equal(t, "t1", found.Entries[0].TaskID)
	require.Equal(t, contract.EventFailed, found.Entries[1].Kind)
	out, err = run("lookup", "+8613800000001")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "2 outcomes for +8613800000001\n"), out)
	require.Contains(t, out, "131026")
}

func formatSeq(n uint64) string { return strconv.FormatUint(n, 10) }

func putValue(t *testing.T, js jetstream.JetStream, bucket, key, value string) {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bucket)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), key, []byte(value))
	require.NoError(t, err)
}
