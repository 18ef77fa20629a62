package gateway

import "time"

// Ledger is a snapshot of what the gateway received and answered since it
// was created or last reset. It is served as JSON at GET /ledger with the
// snake_case names in its tags.
//
// Every send request lands in exactly one outcome, so
// Requests == Accepted + Refused + sum(Injected) + BadSignature + BadRequest.
type Ledger struct {
	// Requests counts every POST to a send path.
	Requests int `json:"requests"`
	// Accepted counts 2xx answers, duplicates included.
	Accepted int `json:"accepted"`
	// AcceptedByKey maps Idempotency-Key to its number of 2xx answers; a value
	// above 1 is a duplicate delivery. Keys never accepted are absent.
	AcceptedByKey map[string]int `json:"accepted_by_key"`
	// RequestsByKey maps the Idempotency-Key header to its number of requests;
	// requests without the header count under "", so its values sum to Requests.
	RequestsByKey map[string]int `json:"requests_by_key"`
	// Duplicates is the sum over keys of accepted-1 where accepted > 1.
	Duplicates int `json:"duplicates"`
	// Refused counts 429s for exceeding RatePerSec.
	Refused int `json:"refused"`
	// Injected counts injected answers by status: "503", "429", "504" from the
	// fault rates, "400" and "401" from PermanentPrefix and FatalPrefix. All
	// five keys are always present.
	Injected map[string]int `json:"injected"`
	// BadSignature counts 401s for a missing or wrong signature.
	BadSignature int `json:"bad_signature"`
	// BadRequest counts requests rejected as malformed: unreadable or too
	// large body, bad JSON, missing id or to, to over 256 bytes, or an
	// Idempotency-Key header missing or different from the body id.
	BadRequest int `json:"bad_request"`
	// AcceptedPerSecond maps an account to its accepted count in each
	// one-second slot since its first accepted request (index 0 is the second
	// starting at that request).
	AcceptedPerSecond map[string][]int `json:"accepted_per_second"`
	// MaxPerSecond maps an account to the largest number of its accepted
	// requests within any one-second sliding window, computed exactly.
	MaxPerSecond map[string]int `json:"max_per_second"`
	// Bodies maps Idempotency-Key to the "body" text of its last accepted
	// request, so tests can check rendering.
	Bodies map[string]string `json:"bodies"`
}

// AcceptedKeys returns the number of distinct Idempotency-Keys accepted at
// least once.
func (l Ledger) AcceptedKeys() int {
	n := 0
	for _, c := range l.AcceptedByKey {
		if c > 0 {
			n++
		}
	}
	return n
}

// InjectedTotal returns the sum of Injected.
func (l Ledger) InjectedTotal() int {
	n := 0
	for _, c := range l.Injected {
		n += c
	}
	return n
}

// injectedCodes are the Injected keys, indexed by fault.
var injectedCodes = [...]string{fault503: "503", fault429: "429", fault504: "504", fault400: "400", fault401: "401"}

type fault int

const (
	fault503 fault = iota
	fault429
	fault504
	fault400
	fault401
	numFaults
)

// keyStats is what the ledger keeps per Idempotency-Key.
type keyStats struct {
	requests int
	accepted int
	body     string
}

// accountStats is what the gateway keeps per account: its token bucket and
// its accepted-request timing.
type accountStats struct {
	bucket bucket
	// first is the time of the first accepted request; perSecond counts
	// accepted requests per one-second slot from it.
	first     time.Duration
	perSecond []int
	// window holds the accepted times of the last second, oldest at head, so
	// maxPerSecond is updated exactly in amortised O(1) per acceptance.
	window       []time.Duration
	head         int
	maxPerSecond int
}

// accept records an accepted request at now, which must not be earlier than
// any time passed before.
func (a *accountStats) accept(now time.Duration) {
	if len(a.perSecond) == 0 {
		a.first = now
	}
	slot := int((now - a.first) / time.Second)
	for len(a.perSecond) <= slot {
		a.perSecond = append(a.perSecond, 0)
	}
	a.perSecond[slot]++

	for a.head < len(a.window) && now-a.window[a.head] >= time.Second {
		a.head++
	}
	if a.head > 1024 && a.head*2 > len(a.window) {
		n := copy(a.window, a.window[a.head:])
		a.window = a.window[:n]
		a.head = 0
	}
	a.window = append(a.window, now)
	a.maxPerSecond = max(a.maxPerSecond, len(a.window)-a.head)
}

// ledgerState is the mutable ledger behind the gateway's mutex.
type ledgerState struct {
	requests     int
	accepted     int
	duplicates   int
	refused      int
	badSignature int
	badRequest   int
	injected     [numFaults]int
	keys         map[string]*keyStats
	accounts     map[string]*accountStats
}

func newLedgerState() ledgerState {
	return ledgerState{keys: make(map[string]*keyStats), accounts: make(map[string]*accountStats)}
}

func (s *ledgerState) key(k string) *keyStats {
	ks := s.keys[k]
	if ks == nil {
		ks = &keyStats{}
		s.keys[k] = ks
	}
	return ks
}

func (s *ledgerState) account(name string) *accountStats {
	a := s.accounts[name]
	if a == nil {
		a = &accountStats{}
		s.accounts[name] = a
	}
	return a
}

// snapshot copies s into a Ledger that shares no memory with it.
func (s *ledgerState) snapshot() Ledger {
	l := Ledger{
		Requests:          s.requests,
		Accepted:          s.accepted,
		AcceptedByKey:     make(map[string]int),
		RequestsByKey:     make(map[string]int, len(s.keys)),
		Duplicates:        s.duplicates,
		Refused:           s.refused,
		Injected:          make(map[string]int, numFaults),
		BadSignature:      s.badSignature,
		BadRequest:        s.badRequest,
		AcceptedPerSecond: make(map[string][]int),
		MaxPerSecond:      make(map[string]int),
		Bodies:            make(map[string]string),
	}
	for f, code := range injectedCodes {
		l.Injected[code] = s.injected[f]
	}
	for k, ks := range s.keys {
		if ks.requests > 0 {
			l.RequestsByKey[k] = ks.requests
		}
		if ks.accepted > 0 {
			l.AcceptedByKey[k] = ks.accepted
			l.Bodies[k] = ks.body
		}
	}
	for name, a := range s.accounts {
		if len(a.perSecond) > 0 {
			l.AcceptedPerSecond[name] = append([]int(nil), a.perSecond...)
			l.MaxPerSecond[name] = a.maxPerSecond
		}
	}
	return l
}
