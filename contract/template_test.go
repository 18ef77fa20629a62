package contract

import (
	"html"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlainTemplatesRenderAsExecuted: templates of text and {{.name}}
// fields take the fast path, with exactly the output of executing them;
// anything else (non-string values, missing fields, actions) executes.
func TestPlainTemplatesRenderAsExecuted(t *testing.T) {
	defaults := map[string]any{"code": "D", "name": "default", "n": 7.0, "nil": nil}
	vars := map[string]any{"name": "Li <&>", "to": "ignored", "list": []any{"a"}}
	for _, c := range []struct {
		src   string
		plain bool // takes the fast path
		want  string
	}{
		{"Hello {{.name}}, your code is {{.code}}", true, "Hello Li <&>, your code is D"},
		{"{{.to}}|{{- .name -}} |x", true, "+1|Li <&>|x"},
		{"no fields", true, "no fields"},
		{"n={{.n}}", false, "n=7"},
		{"{{.nil}}", false, "<no value>"},
		{"{{.list}}", false, "[a]"},
		{"{{.missing}}", false, ""},
		{"{{.name | printf \"%q\"}}", false, `"Li <&>"`},
		{"{{.name.x}}", false, ""},
		{`{{define "a"}}x{{end}}{{.name}}`, false, "Li <&>"},
	} {
		tmpl, err := ParseTemplate(c.src)
		require.NoError(t, err, c.src)
		_, ok := renderPlain(tmpl.plain, defaults, vars, "+1")
		require.Equal(t, c.plain, tmpl.plain != nil && ok, c.src)
		got, gerr := tmpl.Render(defaults, vars, "+1")
		exec, eerr := tmpl.execute(defaults, vars, "+1")
		require.Equal(t, exec, got, c.src)
		require.Equal(t, eerr == nil, gerr == nil, c.src)
		if eerr == nil {
			require.Equal(t, c.want, got, c.src)
		}
	}
}

// TestTemplateNeverPrintsNoValue: what missingkey=error lets through (an
// index of a missing key, a null variable) is an error instead of a message
// reading "<no value>"; that text still goes out when the template or a
// variable holds it.
func TestTemplateNeverPrintsNoValue(t *testing.T) {
	for _, c := range []struct {
		src  string
		vars map[string]any
		want string // "" means ErrNoValue
	}{
		{`Hi {{index . "nick"}}`, map[string]any{"name": "Li"}, ""},
		{`Hi {{index $ .name}}`, map[string]any{"name": "Li"}, ""},
		{`Hi {{.name}}`, map[string]any{"name": nil}, ""},
		{`Hi {{.user.name}}`, map[string]any{"user": map[string]any{"name": nil}}, ""},
		{`Hi {{index . "name"}}`, map[string]any{"name": "Li"}, "Hi Li"},
		{`Hi {{.name}}`, map[string]any{"name": "<no value>"}, "Hi <no value>"},
		{`<no value> {{.name}}`, map[string]any{"name": 7}, "<no value> 7"},
	} {
		tmpl, err := ParseTemplate(c.src)
		require.NoError(t, err, c.src)
		got, err := tmpl.Render(nil, c.vars, "+1")
		if c.want == "" {
			require.ErrorIs(t, err, ErrNoValue, "%s with %v gave %q", c.src, c.vars, got)
			continue
		}
		require.NoError(t, err, c.src)
		require.Equal(t, c.want, got)
	}
}

// TestRenderEscaped: every string of the data is escaped (defaults, vars,
// "to", inside lists and maps), the template's text is not, numbers stay
// numbers, and the caller's maps are left as they were.
func TestRenderEscaped(t *testing.T) {
	t.Parallel()
	tmpl, err := ParseTemplate(`<p>{{.name}} {{.to}} {{.n}}</p>{{range .tags}}<i>{{.}}</i>{{end}}{{.m.k}}|{{.d}}`)
	require.NoError(t, err)
	defaults := map[string]any{"d": `"><img src=x>`}
	vars := map[string]any{"name": "<script>x</script>", "n": 7.0, "tags": []any{"<b>", 1.0}, "m": map[string]any{"k": "&"}}
	out, err := tmpl.RenderEscaped(defaults, vars, "a<b", html.EscapeString)
	require.NoError(t, err)
	require.Equal(t, `<p>&lt;script&gt;x&lt;/script&gt; a&lt;b 7</p><i>&lt;b&gt;</i><i>1</i>&amp;|&#34;&gt;&lt;img src=x&gt;`, out)
	require.Equal(t, "<script>x</script>", vars["name"], "the caller's variables are untouched")
	require.Equal(t, "<b>", vars["tags"].([]any)[0])
	plain, err := ParseTemplate(`Hi {{.name}}`)
	require.NoError(t, err)
	out, err = plain.RenderEscaped(nil, vars, "", html.EscapeString)
	require.NoError(t, err)
	require.Equal(t, "Hi &lt;script&gt;x&lt;/script&gt;", out, "the plain fast path escapes too")
}
