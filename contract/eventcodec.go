package contract

import (
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendEvent appends ev as encoding/json writes it (fields in order,
// omitempty, HTML-safe strings, invalid UTF-8 replaced, floats and times
// formatted alike; TestEventEncoderMatchesEncodingJSON and
// FuzzEventEncoderMatchesEncodingJSON hold it to that). ok is false for
// what encoding/json refuses or writes otherwise (a float that is not
// finite, a year outside 0-9999), which EncodeEvent leaves to it.
//
// Hand-written because a sent event is encoded by each job's handler
// goroutine, new for every job of a job group: go-json's encoder needs a
// large stack frame, and growing each new goroutine's stack to it cost
// 8 µs a recipient, a tenth of the benchmark's CPU.
func appendEvent(b []byte, ev *Event) (_ []byte, ok bool) {
	b = append(b, `{"task_id":`...)
	b = appendJSONString(b, ev.TaskID)
	b = append(b, `,"job_id":`...)
	b = appendJSONString(b, ev.JobID)
	b = append(b, `,"to":`...)
	b = appendJSONString(b, ev.To)
	b = append(b, `,"account":`...)
	b = appendJSONString(b, ev.Account)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, string(ev.Kind))
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(ev.Attempt), 10)
	b = append(b, `,"code":`...)
	b = appendJSONString(b, ev.Code)
	b = append(b, `,"error":`...)
	b = appendJSONString(b, ev.Error)
	if b, ok = appendTime(append(b, `,"at":`...), ev.At); !ok {
		return b, false
	}
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(ev.Index), 10)
	b = appendStringField(b, `,"class":`, string(ev.Class))
	b = appendIntField(b, `,"total":`, int64(ev.Total))
	b = appendIntField(b, `,"duplicates":`, int64(ev.Duplicates))
	b = appendStringField(b, `,"state":`, string(ev.State))
	if b, ok = appendFloatField(b, `,"rate_per_sec":`, ev.RatePerSec); !ok {
		return b, false
	}
	b = appendStringField(b, `,"provider_id":`, ev.ProviderID)
	b = appendBoolField(b, `,"requeued":true`, ev.Requeued)
	b = appendIntField(b, `,"generation":`, int64(ev.Generation))
	if b, ok = appendFloatField(b, `,"latency_ms":`, ev.LatencyMS); !ok {
		return b, false
	}
	if !ev.CallStartedAt.IsZero() {
		if b, ok = appendTime(append(b, `,"call_started_at":`...), ev.CallStartedAt); !ok {
			return b, false
		}
	}
	b = appendBoolField(b, `,"call_shared":true`, ev.CallShared)
	b = appendBoolField(b, `,"maybe_sent":true`, ev.MaybeSent)
	if ev.JobSeq != 0 {
		b = strconv.AppendUint(append(b, `,"job_seq":`...), ev.JobSeq, 10)
	}
	if ev.Delivery != 0 {
		b = strconv.AppendUint(append(b, `,"delivery":`...), ev.Delivery, 10)
	}
	b = appendStringField(b, `,"carried_by":`, ev.CarriedBy)
	b = appendIntField(b, `,"digest_size":`, int64(ev.DigestSize))
	return append(b, '}'), true
}

// eventSizeHint is room for ev encoded: its strings plus the keys, times
// and numbers of a sent event with every optional field, so the buffer is
// made once (a fixed 384 bytes was too small for an SMTP sent event, whose
// growth in the middle was a tenth of dispatch's allocated bytes).
// Strings that need escapes may still grow it.
func eventSizeHint(ev *Event) int {
	return 416 + len(ev.TaskID) + len(ev.JobID) + len(ev.To) + len(ev.Account) + len(ev.Kind) +
		len(ev.Code) + len(ev.Error) + len(ev.Class) + len(ev.State) + len(ev.ProviderID) + len(ev.CarriedBy)
}

// appendTime appends t quoted in RFC 3339 with nanoseconds, as
// encoding/json does; ok is false for what it refuses (a year outside
// 0-9999, a zone offset of a day or more).
func appendTime(b []byte, t time.Time) (_ []byte, ok bool) {
	if y := t.Year(); y < 0 || y > 9999 {
		return b, false
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		return b, false
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), true
}

// The omitempty fields: left out when zero.

func appendStringField(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendJSONString(append(b, key...), s)
}

func appendIntField(b []byte, key string, n int64) []byte {
	if n == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), n, 10)
}

func appendBoolField(b []byte, keyAndTrue string, v bool) []byte {
	if !v {
		return b
	}
	return append(b, keyAndTrue...)
}

func appendFloatField(b []byte, key string, f float64) ([]byte, bool) {
	if f == 0 {
		return b, true
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	b = append(b, key...)
	// encoding/json's float64 format: 'f' unless tiny or huge, and an
	// exponent without a leading zero.
	format := byte('f')
	if abs := math.Abs(f); abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

const jsonHex = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json quotes a string:
// ", \ and control characters escaped, <, > and & as \u003c, \u003e and
// \u0026, invalid UTF-8 as \ufffd, and U+2028 and U+2029 escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', jsonHex[c>>4], jsonHex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', jsonHex[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
