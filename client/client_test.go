package client

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTaskID: the id is found wherever it stands among the top-level keys
// (matched like encoding/json, ignoring case), and never inside a nested
// object; anything unreadable has none.
func TestTaskID(t *testing.T) {
	for in, want := range map[string]string{
		`{"id":"t1","recipients":["a"]}`:                      "t1",
		`{"recipients":[{"to":"a","id":"nested"}],"id":"t2"}`: "t2",
		`{"vars":{"id":"nested"},"ID":"t3"}`:                  "t3",
		`  {"channel":"webhook"}`:                             "",
		`{"id":7}`:                                            "",
		`{"id":`:                                              "",
		`["id","t4"]`:                                         "",
		``:                                                    "",
		`{"template":"{{.id}}","id":"t5","recipients":[1,2,3]} x`: "t5",
	} {
		require.Equal(t, want, taskID([]byte(in)), in)
	}
}
