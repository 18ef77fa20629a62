package contract

import "fmt"

// MaxVarsBytes bounds a recipient's variables, measured as their JSON
// size: they travel in a render batch and again in every job, which must
// fit the server's max_payload. A JSONL list line has the same limit.
const MaxVarsBytes = 64 << 10

// JSONSize estimates the JSON-encoded size of v (decoded JSON: maps,
// slices, strings, numbers, bools, nil). Strings count their bytes plus
// quotes and a sixth for escapes, which is exact enough to cut batches
// well below max_payload; it stops counting once the total passes limit.
func JSONSize(v any, limit int) int {
	n := 0
	var walk func(v any)
	walk = func(v any) {
		if n > limit {
			return
		}
		switch x := v.(type) {
		case nil:
			n += 4
		case string:
			n += len(x) + len(x)/6 + 2
		case bool:
			n += 5
		case float64, int, int64:
			n += 24
		case map[string]any:
			n += 2
			for k, e := range x {
				n += len(k) + 4
				walk(e)
			}
		case []any:
			n += 2
			for _, e := range x {
				n++
				walk(e)
			}
		default:
			n += len(fmt.Sprint(x)) + 2
		}
	}
	walk(v)
	return n
}

// CheckVars reports variables over MaxVarsBytes with the reason render
// skips the recipient for.
func CheckVars(vars map[string]any) string {
	if len(vars) == 0 {
		return ""
	}
	if n := JSONSize(vars, MaxVarsBytes); n > MaxVarsBytes {
		return fmt.Sprintf("vars: more than %d bytes as JSON (limit %d): the job would not fit a message", n, MaxVarsBytes)
	}
	return ""
}

// BatchBytes estimates a render batch recipient's share of its batch.
func (r *BatchRecipient) BatchBytes() int {
	return len(r.To) + len(r.Invalid) + JSONSize(r.Vars, MaxVarsBytes) + 40
}
