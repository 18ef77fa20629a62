package contract

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJSONSizeBoundsEncoding: the estimate is at least the real encoding
// for ordinary values and at most twice it, and CheckVars names the field.
func TestJSONSizeBoundsEncoding(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{"name":"Li","code":"X-1"}`,
		`{"n":12345.5,"ok":true,"none":null,"list":[1,"two",{"three":3}]}`,
		`{"long":"` + strings.Repeat("abcdefgh", 1000) + `"}`,
		`{"中文":"你好，世界"}`,
	} {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(raw), &v))
		enc, _ := json.Marshal(v)
		got := JSONSize(v, 1<<30)
		require.GreaterOrEqual(t, got, len(enc), raw)
		require.LessOrEqual(t, got, 2*len(enc)+32, raw)
	}
	require.Empty(t, CheckVars(map[string]any{"a": "b"}))
	require.Contains(t, CheckVars(map[string]any{"a": strings.Repeat("x", MaxVarsBytes)}), "vars: more than")
}
