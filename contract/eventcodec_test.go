package contract

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	gojson "github.com/goccy/go-json"
	"github.com/stretchr/testify/require"
)

// eventStrings are the texts that encoding/json treats specially.
var eventStrings = []string{"", "plain", "héllo", "<b>&amp;</b>", "\x00\x1f\b\f\n\r\t", `"\`, "\xff\xfe", "a\u2028b\u2029c",
	"\U0001F600", "\xed\xa0\x80", "tab\there", "\x7f"}

// randomEvent draws every field, often zero (omitempty), with the floats
// and times encoding/json formats in more than one way.
func randomEvent(r *rand.Rand) *Event {
	str := func() string {
		if r.IntN(3) == 0 {
			return ""
		}
		return eventStrings[r.IntN(len(eventStrings))] + eventStrings[r.IntN(len(eventStrings))]
	}
	num := func() int {
		switch r.IntN(3) {
		case 0:
			return 0
		case 1:
			return r.IntN(100)
		}
		return int(r.Int64()) - math.MaxInt64/2
	}
	floats := []float64{0, 1, -1.5, 1e-7, 1e-6, 123456.789, 1e20, 1e21, 3e-9, math.SmallestNonzeroFloat64, math.MaxFloat64, 0.1 + 0.2}
	zones := []*time.Location{time.UTC, time.FixedZone("x", 3600), time.FixedZone("y", -(5*3600 + 30*60)), time.FixedZone("z", 23*3600+59*60)}
	when := func() time.Time {
		if r.IntN(4) == 0 {
			return time.Time{}
		}
		return time.Unix(r.Int64N(1<<34), r.Int64N(1e9)).In(zones[r.IntN(len(zones))])
	}
	return &Event{TaskID: str(), JobID: str(), To: str(), Account: str(), Kind: EventKind(str()), Attempt: num(),
		Code: str(), Error: str(), At: when(), Index: num(), Class: ErrorClass(str()), Total: num(), Duplicates: num(),
		State: TaskState(str()), RatePerSec: floats[r.IntN(len(floats))], ProviderID: str(), Requeued: r.IntN(2) == 0,
		Generation: num(), LatencyMS: floats[r.IntN(len(floats))], CallStartedAt: when(), CallShared: r.IntN(2) == 0, MaybeSent: r.IntN(2) == 0,
		JobSeq: uint64(num()), Delivery: r.Uint64(), CarriedBy: str(), DigestSize: num()}
}

// TestEventEncoderMatchesEncodingJSON: EncodeEvent writes exactly what
// encoding/json writes, for every field zero and not, and refuses what it
// refuses.
func TestEventEncoderMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		ev := randomEvent(r)
		want, err := json.Marshal(ev)
		require.NoError(t, err)
		got, err := EncodeEvent(ev)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "event %d: %#v", i, ev)
	}
	for _, ev := range []*Event{{RatePerSec: math.NaN()}, {LatencyMS: math.Inf(1)}, {At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{CallStartedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}, {At: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600))}} {
		_, werr := json.Marshal(ev)
		_, gerr := EncodeEvent(ev)
		require.Error(t, werr)
		require.Error(t, gerr, "%#v", ev)
	}
}

// FuzzEventEncoderMatchesEncodingJSON: for any texts and numbers,
// EncodeEvent and encoding/json write the same bytes.
func FuzzEventEncoderMatchesEncodingJSON(f *testing.F) {
	f.Add("t1", "t1.42", "+8613000000042", "\xff<&>\u2028", int64(42), 12.5, int64(1764484502))
	f.Add("", "", "", "", int64(0), 0.0, int64(0))
	f.Add("\x00", "\"\\", "é", "\U0001F600", int64(-1), 1e-7, int64(-62135596800))
	f.Fuzz(func(t *testing.T, a, b, c, d string, n int64, x float64, sec int64) {
		ev := &Event{TaskID: a, JobID: b, To: c, Account: d, Kind: EventKind(d), Code: a, Error: b + c, Attempt: int(n),
			Index: int(n / 3), At: time.Unix(sec, n%1e9).UTC(), RatePerSec: x, LatencyMS: -x, ProviderID: c, CallStartedAt: time.Unix(n, sec%1e9),
			CarriedBy: d, JobSeq: uint64(n), Delivery: uint64(sec), Total: int(n), MaybeSent: n%2 == 0}
		want, werr := json.Marshal(ev)
		got, gerr := EncodeEvent(ev)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%#v: encoding/json %v, EncodeEvent %v", ev, werr, gerr)
		}
		if werr == nil && string(want) != string(got) {
			t.Fatalf("%#v:\nencoding/json %s\nEncodeEvent   %s", ev, want, got)
		}
	})
}

func benchEvent() *Event {
	return &Event{TaskID: "bench", JobID: "bench.123456", To: "user-123456@example.com", Account: "sandbox-1", Kind: EventSent,
		Attempt: 1, Code: "200", At: time.Now().UTC(), Index: 123456, RatePerSec: 15000, ProviderID: "gw-123456", LatencyMS: 0.213}
}

// BenchmarkEncodeEvent: a sent event as dispatch writes it, from one
// goroutine, and from a new goroutine each time as dispatch's job
// handlers do (where go-json's stack growth shows).
func BenchmarkEncodeEvent(b *testing.B) {
	encoders := []struct {
		name string
		enc  func(*Event) ([]byte, error)
	}{{"EncodeEvent", EncodeEvent}, {"go-json", func(ev *Event) ([]byte, error) { return gojson.Marshal(ev) }}}
	for _, e := range encoders {
		b.Run(e.name+"/one goroutine", func(b *testing.B) {
			ev := benchEvent()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.enc(ev); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(e.name+"/new goroutines", func(b *testing.B) {
			ev := benchEvent()
			b.ReportAllocs()
			done := make(chan error)
			for b.Loop() {
				go func() {
					_, err := e.enc(ev)
					done <- err
				}()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEncodeEventAllocatesOnce: a sent event as dispatch publishes it, and
// a failed one with a long error, are encoded into a buffer made once (a
// buffer grown in the middle was a tenth of dispatch's allocated bytes).
func TestEncodeEventAllocatesOnce(t *testing.T) {
	now := time.Date(2026, 12, 6, 23, 13, 47, 123456789, time.UTC)
	sent := &Event{TaskID: "compare-16-1765062827123456789", JobID: "01KBWJ1T8M6Q5ZQ7B3F9C2D4E5-000123", To: "user12345@example.org",
		Account: "sink", Kind: EventSent, Attempt: 1, At: now, Index: 12344, ProviderID: "<01KBWJ1T8M6Q5ZQ7B3F9C2D4E5-000123@broadcast.example.org>",
		LatencyMS: 12.345678, CallStartedAt: now, CallShared: true, JobSeq: 1234567, Delivery: 1, Generation: 2}
	failed := *sent
	failed.Kind, failed.Code, failed.Class = EventFailed, "550", ClassPermanent
	failed.Error = "550 5.1.1 <user12345@example.org>: Recipient address rejected: User unknown in virtual mailbox table"
	for _, ev := range []*Event{sent, &failed} {
		var n int
		allocs := testing.AllocsPerRun(100, func() {
			b, err := EncodeEvent(ev)
			require.NoError(t, err)
			n = len(b)
		})
		require.Equal(t, 1.0, allocs, "%s event of %d bytes", ev.Kind, n)
	}
}
