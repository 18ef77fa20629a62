package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestPolicyCommand: set then get returns the stored value; a value that
// does not validate, or a key that is neither default nor a channel, is
// refused with the field named and nothing is stored (the bucket's
// revisions are counted); ls lists every key with its summary, marking a
// value that does not validate; rm removes a key and refuses one not
// stored; check validates without a server.
func TestPolicyCommand(t *testing.T) {
	ts := topologytest.Start(t)
	ctx := t.Context()
	runIn := func(in string, args ...string) (string, error) {
		var out bytes.Buffer
		err := policyCommand(ctx, ts.JS, args, strings.NewReader(in), &out)
		return out.String(), err
	}
	run := func(args ...string) (string, error) { return runIn("", args...) }
	kv, err := ts.JS.KeyValue(ctx, contract.BucketPolicy)
	require.NoError(t, err)
	stored := func() map[string]string {
		t.Helper()
		st, err := kv.Status(ctx)
		require.NoError(t, err)
		got := map[string]string{}
		if st.Values() == 0 {
			return got
		}
		keys, err := kv.ListKeys(ctx)
		require.NoError(t, err)
		for k := range keys.Keys() {
			e, err := kv.Get(ctx, k)
			require.NoError(t, err)
			got[k] = string(e.Value())
		}
		return got
	}

	out, err := run("get")
	require.NoError(t, err)
	require.Equal(t, "no policy is stored under default: channels without their own key have no policy\n", out)
	out, err = run("ls")
	require.NoError(t, err)
	require.Equal(t, "no policy is stored: no caps, no quiet hours\n", out)

	const def = `{"frequency_caps": [{"category":"marketing","max":2,"window":"24h"},
	  {"max":6,"window":"168h"}],
	  "quiet_hours": {"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai","categories":["marketing"]}}`
	compact := `{"frequency_caps":[{"category":"marketing","max":2,"window":"24h"},{"max":6,"window":"168h"}],"quiet_hours":{"start":"21:00","end":"09:00","default_tz":"Asia/Shanghai","categories":["marketing"]}}`
	out, err = run("set", "default", def)
	require.NoError(t, err)
	require.Equal(t, "stored default (revision 1): caps marketing: 2 per 24h0m0s; all but transactional: 6 per 168h0m0s, quiet 21:00-09:00 default_tz Asia/Shanghai for marketing\n", out)
	out, err = runIn(`{"frequency_caps":[{"max":1,"window":"24h"}]}`, "set", "whatsapp", "-")
	require.NoError(t, err)
	require.Contains(t, out, "stored whatsapp (revision 2): caps all but transactional: 1 per 24h0m0s, no quiet hours")
	require.Equal(t, map[string]string{"default": compact, "whatsapp": `{"frequency_caps":[{"max":1,"window":"24h"}]}`}, stored())

	// get round trip: the value as stored, and with -json its metadata.
	out, err = run("get")
	require.NoError(t, err)
	var back bytes.Buffer
	require.NoError(t, json.Compact(&back, []byte(out)))
	require.Equal(t, compact, back.String())
	out, err = run("get", "-json", "whatsapp")
	require.NoError(t, err)
	var sp storedPolicy
	require.NoError(t, json.Unmarshal([]byte(out), &sp))
	back.Reset()
	require.NoError(t, json.Compact(&back, sp.Value))
	require.Equal(t, [3]string{"whatsapp", `{"frequency_caps":[{"max":1,"window":"24h"}]}`, ""}, [3]string{sp.Key, back.String(), sp.Error})
	require.Equal(t, uint64(2), sp.Revision)
	out, err = run("get", "smtp")
	require.NoError(t, err)
	require.Equal(t, "no policy is stored under smtp: the default applies to this channel\n", out)

	// Refused values and keys store nothing.
	for _, c := range []struct {
		args []string
		in   string
		want string
	}{
		{[]string{"set", "default", `{"frequency_caps":[{"max":2,"window":"24h"},{"max":2,"window":"a day"}]}`}, "", `frequency_caps[1].window: want a Go duration such as "24h", got "a day"`},
		{[]string{"set", "whatsapp", "-"}, `{"quiet_hours":{"start":"21:00","end":"21:00"}}`, "quiet_hours.end: equals start"},
		{[]string{"set", "default", `{"frequency_caps":[],"colour":"red"}`}, "", `unknown field "colour"`},
		{[]string{"set", "default", `{"frequency_caps":`}, "", "policy: unexpected EOF"},
		{[]string{"set", "fax", `{}`}, "", `key: "fax" is neither "default" nor a channel (sandbox, smtp, webhook, whatsapp, wxpusher)`},
		{[]string{"set", "default"}, "", "give KEY and the value"},
		{[]string{"rm", "smtp"}, "", "no policy is stored under smtp"},
		{[]string{"get", "a", "b"}, "", "give at most one KEY"},
		{[]string{"frobnicate"}, "", "unknown subcommand"},
	} {
		_, err := runIn(c.in, c.args...)
		require.ErrorContains(t, err, c.want, c.args)
	}
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), st.Values(), "no refused value was stored")
	require.Equal(t, compact, stored()["default"])

	// A value written around the CLI that does not validate shows as
	// not applied.
	_, err = kv.Put(ctx, "smtp", []byte(`{"frequency_caps":[{"max":0,"window":"1h"}]}`))
	require.NoError(t, err)
	out, err = run("ls")
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^KEY\s+REVISION\s+UPDATED\s+POLICY$`, lines[0])
	require.Regexp(t, `^default\s+1\s+\S+\s+caps marketing: 2 per 24h0m0s; all but transactional: 6 per 168h0m0s, quiet 21:00-09:00 default_tz Asia/Shanghai for marketing$`, lines[1])
	require.Regexp(t, `^smtp\s+3\s+\S+\s+not applied, dispatch treats it as absent: frequency_caps\[0\]\.max: must be at least 1, got 0$`, lines[2])
	require.Regexp(t, `^whatsapp\s+2\s+\S+\s+caps all but transactional: 1 per 24h0m0s, no quiet hours$`, lines[3])
	out, err = run("ls", "-json")
	require.NoError(t, err)
	var keys []string
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var sp storedPolicy
		require.NoError(t, json.Unmarshal([]byte(line), &sp))
		keys = append(keys, sp.Key)
		require.Equal(t, sp.Key == "smtp", sp.Error != "", sp.Key)
	}
	require.Equal(t, []string{"default", "smtp", "whatsapp"}, keys)

	out, err = run("rm", "whatsapp")
	require.NoError(t, err)
	require.Equal(t, "removed whatsapp: the default applies to this channel\n", out)
	_, err = run("rm", "smtp")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"default": compact}, stored())
	out, err = run("get", "whatsapp")
	require.NoError(t, err)
	require.Contains(t, out, "no policy is stored under whatsapp")

	// check needs no server and stores nothing.
	var buf bytes.Buffer
	require.NoError(t, policyCommand(ctx, nil, []string{"check", `{"quiet_hours":{"start":"22:00","end":"07:30"}}`}, io.MultiReader(), &buf))
	require.Equal(t, "valid: no caps, quiet 22:00-07:30 default_tz UTC\n", buf.String())
	err = policyCommand(ctx, nil, []string{"check", "-"}, strings.NewReader(`{"frequency_caps":[{"max":1,"window":"800h"}]}`), &buf)
	require.ErrorContains(t, err, "frequency_caps[0].window: must be above 0 and at most 744h0m0s")
	require.Equal(t, map[string]string{"default": compact}, stored())
}
