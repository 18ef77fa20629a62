package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

// TestSuppressCommand: add, list, remove and import through the CLI, and
// errors that name the field.
func TestSuppressCommand(t *testing.T) {
	ts := topologytest.Start(t)
	ctx := t.Context()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := suppressCommand(ctx, ts.JS, args, &out)
		return out.String(), err
	}
	out, err := run("add", "-channel", "whatsapp", "-reason", "opt_out", "-categories", "marketing", "+86 138 0000 0001")
	require.NoError(t, err)
	require.Equal(t, "added whatsapp."+contract.RecipientHash("+8613800000001")+"\n", out)

	for _, c := range []struct{ args, want string }{
		{"add -channel whatsapp -reason nope +8613800000001", "reason: want one of"},
		{"add -channel whatsapp -reason manual -categories promo +8613800000001", "categories[0]: must be marketing"},
		{"add -reason manual +8613800000001", "-channel: required"},
		{"add -all -channel smtp -reason manual x", "give one, not both"},
		{"add -channel fax -reason manual x", `scope: "fax" is neither`},
		{"add -channel whatsapp -reason manual 12345", "to: "},
		{"add -all -reason manual -until tomorrow x", "until: want an RFC 3339"},
		{"frobnicate", "unknown subcommand"},
	} {
		_, err := run(strings.Fields(c.args)...)
		require.ErrorContains(t, err, c.want, c.args)
	}

	dir := t.TempDir()
	csvFile := filepath.Join(dir, "list.csv")
	require.NoError(t, os.WriteFile(csvFile, []byte("to,reason,scope,categories\nA@Example.ORG,bounce,smtp,\nuser-9,manual,all,marketing;utility\n"), 0o600))
	out, err = run("import", csvFile)
	require.NoError(t, err)
	require.Equal(t, "imported 2 entries\n", out)
	jsonl := filepath.Join(dir, "list.jsonl")
	require.NoError(t, os.WriteFile(jsonl, []byte(`{"to":"+1 650 555 0100","reason":"opt_out"}`+"\n"+`{"to":"x","reason":"manual","colour":"red"}`+"\n"), 0o600))
	_, err = run("import", "-channel", "whatsapp", jsonl)
	require.ErrorContains(t, err, "line 2:")
	require.ErrorContains(t, err, "colour")
	require.ErrorContains(t, err, "after 1 added")
	badCSV := filepath.Join(dir, "bad.csv")
	require.NoError(t, os.WriteFile(badCSV, []byte("to,why\nx,y\n"), 0o600))
	_, err = run("import", "-all", badCSV)
	require.ErrorContains(t, err, `column "reason" is required`)

	out, err = run("list", "-json")
	require.NoError(t, err)
	got := map[string]suppress.Stored{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var s suppress.Stored
		require.NoError(t, json.Unmarshal([]byte(line), &s))
		got[s.Scope+" "+s.To] = s
	}
	require.Len(t, got, 4)
	require.Equal(t, "bounce", got["smtp a@example.org"].Reason)
	require.Equal(t, []contract.Category{"marketing", "utility"}, got["all user-9"].Categories)
	require.Equal(t, "import", got["whatsapp +16505550100"].Source)
	require.Equal(t, "cli", got["whatsapp +8613800000001"].Source)

	out, err = run("remove", "-channel", "whatsapp", "+8613800000001")
	require.NoError(t, err)
	require.Contains(t, out, "removed whatsapp.")
	out, err = run("list")
	require.NoError(t, err)
	require.Equal(t, 4, strings.Count(out, "\n"), out) // header and three entries
	require.NotContains(t, out, "+8613800000001")
}
