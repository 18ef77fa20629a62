package contract

import (
	"regexp"
	"strings"
	"testing"
)

// TestValidIDMatchesItsPattern: ValidID accepts exactly the strings of
// ^[A-Za-z0-9_-]{1,64}$, the ids the contract documents, over every
// single byte, the length bounds and strings that are valid but for one
// byte.
func TestValidIDMatchesItsPattern(t *testing.T) {
	pattern := regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	cases := []string{"", "a", "task-1_A", strings.Repeat("x", 64), strings.Repeat("x", 65),
		"a.b", "a b", "a*", "a>", "ä", "task\n", "\x00", "-", "_"}
	for c := 0; c < 256; c++ {
		cases = append(cases, string([]byte{byte(c)}), "id"+string([]byte{byte(c)})+"x")
	}
	accepted := 0
	for _, s := range cases {
		if got, want := ValidID(s), pattern.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", s, got, want)
		}
		if ValidID(s) {
			accepted++
		}
	}
	// 64 one-byte ids and 64 with that byte inside, plus the five valid
	// ones named.
	if accepted != 2*64+5 {
		t.Errorf("accepted %d of %d cases, want %d", accepted, len(cases), 2*64+5)
	}
}

func BenchmarkValidID(b *testing.B) {
	for b.Loop() {
		ValidID("01JABCDEFGHJKMNPQRSTVWXYZ0-task")
	}
}
