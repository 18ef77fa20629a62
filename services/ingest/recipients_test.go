package ingest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func collect(t *testing.T, name, data string) ([]listEntry, error) {
	t.Helper()
	var out []listEntry
	err := readList(strings.NewReader(data), name, func(e listEntry) error {
		out = append(out, e)
		return nil
	})
	return out, err
}

func TestReadJSONL(t *testing.T) {
	t.Parallel()
	es, err := collect(t, "x.jsonl", "{\"to\":\"a\",\"vars\":{\"n\":1}}\n\n{\"to\":\"b\"}\n{bad\n{\"to\":\"c\"}")
	require.NoError(t, err)
	require.Len(t, es, 4)
	require.Equal(t, "a", es[0].Recipient.To)
	require.EqualValues(t, 1, es[0].Recipient.Vars["n"])
	require.Equal(t, 3, es[1].Line)
	require.Contains(t, es[2].Invalid, "line 4: invalid JSON")
	require.Equal(t, "c", es[3].Recipient.To)
}

func TestReadCSV(t *testing.T) {
	t.Parallel()
	es, err := collect(t, "list.csv", "\ufeffname,to,code\nLi,+861,X\n\"Wang, Jr\",+862,Y\nshort\n")
	require.NoError(t, err)
	require.Len(t, es, 3)
	require.Equal(t, "+861", es[0].Recipient.To)
	require.Equal(t, map[string]any{"name": "Li", "code": "X"}, es[0].Recipient.Vars)
	require.Equal(t, "Wang, Jr", es[1].Recipient.Vars["name"])
	require.Equal(t, "line 4: 1 fields, header has 3", es[2].Invalid)

	_, err = collect(t, "list.csv", "name,phone\nLi,1\n")
	require.ErrorContains(t, err, `header: no "to" column`)
	es, err = collect(t, "empty.csv", "")
	require.NoError(t, err)
	require.Empty(t, es)
}

func TestFormatSniffing(t *testing.T) {
	t.Parallel()
	require.Equal(t, formatCSV, formatOf("a.CSV", '{'))
	require.Equal(t, formatJSONL, formatOf("a.ndjson", 't'))
	require.Equal(t, formatJSONL, formatOf("noext", '{'))
	require.Equal(t, formatCSV, formatOf("noext", 't'))
}

func TestJSONLLineTooLong(t *testing.T) {
	t.Parallel()
	_, err := collect(t, "x.jsonl", `{"to":"`+strings.Repeat("a", maxLineBytes)+`"}`)
	require.ErrorContains(t, err, "longer than")
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r *strings.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// TestCSVRecordLimit: an unterminated quote does not pull the rest of a
// 16 MB list into memory: the list is refused after about a line's limit,
// and rows before it were read.
func TestCSVRecordLimit(t *testing.T) {
	t.Parallel()
	src := &countingReader{r: strings.NewReader("to,name\n+8613800000001,Li\n\"+8613800000002,Wang\n" + strings.Repeat("x", 16<<20))}
	var got []listEntry
	err := readList(src, "x.csv", func(e listEntry) error { got = append(got, e); return nil })
	t.Logf("unterminated quote in a 16 MiB list: refused after reading %d bytes: %v", src.n, err)
	require.ErrorContains(t, err, "line 3: a record longer than")
	var le *listError
	require.ErrorAs(t, err, &le, "a content problem rejects the task")
	require.Len(t, got, 1)
	// readList's own 64 KiB read-ahead comes on top of the limit.
	require.Less(t, src.n, maxRecordBytes+72<<10, "reading stopped at the limit")

	// Long but legal records pass.
	ok := "to,note\n" + strings.Repeat("+86138000000,"+strings.Repeat("n", 60<<10)+"\n", 40)
	n := 0
	require.NoError(t, readList(strings.NewReader(ok), "y.csv", func(listEntry) error { n++; return nil }))
	require.Equal(t, 40, n)
}
