package ingest

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/broadcastd/broadcast/contract"
)

// maxLineBytes bounds one JSONL line (a recipient with its variables).
const maxLineBytes = 64 << 10

// listFormat is how a recipient list object is encoded.
type listFormat int

const (
	formatJSONL listFormat = iota
	formatCSV
)

// formatOf picks the format from the object name, else from its first byte.
func formatOf(name string, first byte) listFormat {
	lower := strings.ToLower(name)
	switch {
	case strings.HasSuffix(lower, ".csv"):
		return formatCSV
	case strings.HasSuffix(lower, ".jsonl"), strings.HasSuffix(lower, ".ndjson"), first == '{':
		return formatJSONL
	}
	return formatCSV
}

// listEntry is one line of a recipient list: a recipient, or the reason the
// line is unusable (it still counts, and is skipped with that reason).
type listEntry struct {
	Line      int
	Recipient contract.Recipient
	Invalid   string
}

// readList streams a recipient list, calling fn for every entry in order.
// It never holds more than one line in memory.
func readList(r io.Reader, name string, fn func(listEntry) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	first, err := br.Peek(1)
	if errors.Is(err, io.EOF) {
		return nil // empty list: zero recipients
	}
	if err != nil {
		return err
	}
	if formatOf(name, first[0]) == formatCSV {
		return readCSV(br, fn)
	}
	return readJSONL(br, fn)
}

func readJSONL(r io.Reader, fn func(listEntry) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		e := listEntry{Line: line}
		if err := contract.DecodeRecipient([]byte(text), &e.Recipient); err != nil {
			e.Invalid = fmt.Sprintf("line %d: invalid JSON: %v", line, err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return &listError{fmt.Sprintf("line %d: longer than %d bytes", line+1, maxLineBytes)}
		}
		return err
	}
	return nil
}

// maxRecordBytes bounds what the CSV reader may read for one record: a
// line's limit plus the reader's read-ahead. encoding/csv has no limit of
// its own, and an unterminated quote would pull the rest of the object
// into one field.
const maxRecordBytes = maxLineBytes + 64<<10

// errRecordTooLong is returned by recordLimiter past maxRecordBytes.
var errRecordTooLong = errors.New("record too long")

// recordLimiter counts the bytes read since the last reset and fails past
// its limit.
type recordLimiter struct {
	r     io.Reader
	n     int
	limit int
}

func (l *recordLimiter) Read(p []byte) (int, error) {
	if l.n >= l.limit {
		return 0, errRecordTooLong
	}
	if len(p) > l.limit-l.n {
		p = p[:l.limit-l.n]
	}
	n, err := l.r.Read(p)
	l.n += n
	return n, err
}

func readCSV(r io.Reader, fn func(listEntry) error) error {
	lim := &recordLimiter{r: r, limit: maxRecordBytes}
	r = lim
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return &listError{fmt.Sprintf("header: %v", err)}
	}
	header = append([]string(nil), header...)
	toCol := -1
	for i, h := range header {
		header[i] = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if header[i] == "to" {
			toCol = i
		}
	}
	if toCol < 0 {
		return &listError{fmt.Sprintf(`header: no "to" column (got %q)`, strings.Join(header, ","))}
	}
	line := 1
	for {
		lim.n = 0
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		line++
		if errors.Is(err, errRecordTooLong) {
			return &listError{fmt.Sprintf("line %d: a record longer than %d bytes (an unterminated quote?)", line, maxLineBytes)}
		}
		e := listEntry{Line: line}
		var perr *csv.ParseError
		switch {
		case errors.As(err, &perr):
			e.Invalid = fmt.Sprintf("line %d: %v", perr.Line, perr.Err)
		case err != nil:
			return err
		case len(rec) != len(header):
			e.Invalid = fmt.Sprintf("line %d: %d fields, header has %d", line, len(rec), len(header))
		default:
			e.Recipient.To = rec[toCol]
			if len(header) > 1 {
				e.Recipient.Vars = make(map[string]any, len(header)-1)
				for i, h := range header {
					if i != toCol && h != "" {
						e.Recipient.Vars[h] = rec[i]
					}
				}
			}
		}
		if err := fn(e); err != nil {
			return err
		}
	}
}

// listError is a problem with the list's content (not with reading it): the
// task is rejected with it instead of retried.
type listError struct{ reason string }

func (e *listError) Error() string { return e.reason }
