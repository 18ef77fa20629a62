package contract

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDigestFieldsNameTheField(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	base := `"id":"t1","channel":"webhook","template":"Hi","recipients":[{"to":"a"}]`
	for _, c := range []struct{ in, want string }{
		{`{` + base + `,"digest_key":"news","digest_window":"10m","digest_template":"{{.count}}:{{range .items}}{{.body}} {{.task_id}} {{.job_id}}{{end}} {{.to}}"}`, ""},
		{`{` + base + `,"digest_key":"news"}`, ""},
		{`{` + base + `,"digest_key":"a b"}`, `digest_key: must match [A-Za-z0-9_.:-]{1,128}, got "a b"`},
		{`{` + base + `,"digest_key":"` + strings.Repeat("k", 129) + `"}`, "digest_key: must match"},
		{`{` + base + `,"digest_window":"10m"}`, "digest_window: needs digest_key"},
		{`{` + base + `,"digest_template":"x"}`, "digest_template: needs digest_key"},
		{`{` + base + `,"digest_key":"k","digest_window":"ten"}`, `digest_window: not a Go duration (e.g. "10m"): "ten"`},
		{`{` + base + `,"digest_key":"k","digest_window":"500ms"}`, "digest_window: must be between 1s and 24h0m0s, got 500ms"},
		{`{` + base + `,"digest_key":"k","digest_window":"25h"}`, "digest_window: must be between 1s and 24h0m0s, got 25h0m0s"},
		{`{` + base + `,"digest_key":"k","digest_template":"{{range .items}}"}`, "digest_template: "},
		{`{` + base + `,"digest_key":"k","digest_template":"{{.title}}"}`, "digest_template: "},
		{`{` + base + `,"digest_key":"k","digest_template":"{{range .items}}{{.name}}{{end}}"}`, "digest_template: "},
		{`{` + base + `,"digest_key":"k","digest_template":"` + strings.Repeat("x", MaxDigestTemplateBytes+1) + `"}`, "digest_template: is 8193 bytes, limit is 8192"},
	} {
		task, err := DecodeTask([]byte(c.in))
		if err == nil {
			task.Normalize()
			err = task.Validate(now)
		}
		if c.want == "" {
			require.NoError(t, err, c.in)
			continue
		}
		require.Error(t, err, c.in)
		require.Contains(t, err.Error(), c.want, c.in)
	}
}

func TestRenderDigest(t *testing.T) {
	t.Parallel()
	items := []DigestItem{{Body: "one", TaskID: "a", JobID: "a.0"}, {Body: "two", TaskID: "b", JobID: "b.3"}}
	body, err := RenderDigest("{{.count}} for {{.to}}:{{range .items}} {{.job_id}}={{.body}}{{end}}", items, "+1")
	require.NoError(t, err)
	require.Equal(t, "2 for +1: a.0=one b.3=two", body)
	body, err = RenderDigest("", items, "+1")
	require.NoError(t, err)
	require.Equal(t, "one\ntwo\n", body)
}

func TestDigestHashHidesTheInput(t *testing.T) {
	t.Parallel()
	h := DigestHash("+8613800000001")
	require.Len(t, h, 32)
	require.NotContains(t, h, "8613800000001")
	require.Equal(t, h, DigestHash("+8613800000001"))
	require.NotEqual(t, h, DigestHash("+8613800000002"))
}
