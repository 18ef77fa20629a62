package shared

import (
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
