package shared

import (
	"hash/fnv"
	"math"

	"github.com/broadcastd/broadcast/contract"
)

// PickAccount chooses the sender account for a recipient among candidates,
// with weighted rendezvous hashing: the same recipient keeps landing on the
// same account while the pool is unchanged (so per-recipient gaps are
// enforced where the sends happen), and accounts with more remaining
// capacity get proportionally more recipients. health may be nil.
func PickAccount(candidates []*contract.Account, to string, health *HealthWatcher) *contract.Account {
	return NewPicker(candidates, health).Pick(to)
}

// Picker is PickAccount for many recipients over the same candidates (a
// render batch): the accounts' weights and the hash of their names are
// taken once, and the recipient's once per pick, so a recipient costs a
// few multiplications per account (a task over 1,000 accounts spent most
// of render's time in PickAccount).
//
// An account's score for a recipient hashes the two names' hashes
// together: mix64(nameHash(account) ^ nameHash(recipient)), nameHash being
// FNV-1a finished with mix64.
type Picker struct {
	candidates []*contract.Account
	weights    []float64 // capacityWeight; <= 0: out of capacity
	seeds      []uint64  // nameHash of each candidate's name
	equal      bool      // every weight the same and positive
}

// NewPicker prepares picks among candidates, with their health as it is
// now (health may be nil).
func NewPicker(candidates []*contract.Account, health *HealthWatcher) *Picker {
	p := &Picker{candidates: candidates, weights: make([]float64, len(candidates)), seeds: make([]uint64, len(candidates)), equal: true}
	for i, a := range candidates {
		p.weights[i] = capacityWeight(a, health.Get(a.Name))
		p.seeds[i] = nameHash(a.Name)
		if p.weights[i] <= 0 || p.weights[i] != p.weights[0] {
			p.equal = false
		}
	}
	return p
}

// Pick returns the account for recipient to (nil without candidates).
func (p *Picker) Pick(to string) *contract.Account {
	if len(p.candidates) == 0 {
		return nil
	}
	return p.candidates[p.index(to, nil, nil)]
}

// index is the position of to's account among the candidates i with
// counts[i] < caps[i] (every candidate when caps is nil): the one its
// weighted rendezvous score ranks first. There is at least one candidate.
func (p *Picker) index(to string, counts, caps []int) int {
	if len(p.candidates) == 1 {
		return 0
	}
	if i := p.rank(to, counts, caps); i >= 0 {
		return i
	}
	if caps != nil { // more picks than the batch was sized for
		return p.index(to, nil, nil)
	}
	// Every account is out of capacity: spread evenly.
	h := fnv.New32a()
	h.Write([]byte(to))
	return int(h.Sum32() % uint32(len(p.candidates)))
}

// rank is the index of to's highest-scoring candidate with room, or -1.
func (p *Picker) rank(to string, counts, caps []int) int {
	best := -1
	key := nameHash(to)
	if p.equal {
		// With one weight the highest score is the highest u: no logarithm.
		var bestU uint64
		for i, seed := range p.seeds {
			if caps != nil && counts[i] >= caps[i] {
				continue
			}
			if u := mix64(seed^key) >> 11; best < 0 || u > bestU {
				best, bestU = i, u
			}
		}
		return best
	}
	bestScore := math.Inf(-1)
	for i, seed := range p.seeds {
		w := p.weights[i]
		if w <= 0 || caps != nil && counts[i] >= caps[i] {
			continue
		}
		// Map the hash to (0,1) and score it: -w/ln(u) is the classic
		// weighted rendezvous score.
		u := (float64(mix64(seed^key)>>11) + 0.5) / (1 << 53)
		if score := -w / math.Log(u); score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// Balancer picks the accounts of one batch of recipients (a render batch):
// a recipient goes to its rendezvous account (Pick) unless that account
// already holds its share of the batch, rounded up, plus slackPercent of
// it, and then to its best-ranked account with room. Hashing alone gives
// 1,000 equal accounts 60 ± 8 each of 60,000 recipients, and the busiest,
// paced like the others, sets the task's least time (0.65 of what an
// even spread allows). Shares held exactly (slack 0, render's default)
// spread every batch evenly, for the price of recipients sent through
// another account than their usual one: 3 in 100 over 3 accounts, 1 in
// 7 over 1,000 with 16 each a batch. A slack of 10 moves 1 in 400 and 1
// in 16, and lets the busiest of 1,000 take 68 where the mean is 60
// (13 % more time). The picks depend only on the recipients in order,
// the pool, its weights and the slack, so a batch rendered again gets
// the same ones.
type Balancer struct {
	p      *Picker
	counts []int
	caps   []int
}

// Balance prepares the picks of a batch of n recipients, each account
// taking at most slackPercent over its share.
func (p *Picker) Balance(n, slackPercent int) *Balancer {
	b := &Balancer{p: p}
	if len(p.candidates) < 2 {
		return b
	}
	total := 0.0
	for _, w := range p.weights {
		total += max(w, 0)
	}
	if total <= 0 { // every account out of capacity: Pick spreads evenly
		return b
	}
	b.counts = make([]int, len(p.candidates))
	b.caps = make([]int, len(p.candidates))
	for i, w := range p.weights {
		if w > 0 {
			// Less a millionth, so a share of exactly 16 that the float sum
			// of the weights makes 16.000000001 is not rounded up to 17.
			share := float64(n) * w / total
			b.caps[i] = int(math.Ceil(share*float64(100+slackPercent)/100 - 1e-6))
		}
	}
	return b
}

// Pick returns the account for the batch's next recipient, to.
func (b *Balancer) Pick(to string) *contract.Account {
	if len(b.p.candidates) == 0 {
		return nil
	}
	i := b.p.index(to, b.counts, b.caps)
	if b.caps != nil {
		b.counts[i]++
	}
	return b.p.candidates[i]
}

// FNV-1a, 64 bits, as hash/fnv computes it.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// nameHash is the 64-bit FNV-1a of s finished with mix64, which spreads
// the differences between similar names over all of the bits.
func nameHash(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime64
	}
	return mix64(h)
}

// capacityWeight is how much an account can still take: its remaining
// daily cap when it has one, else a day at its configured rate.
func capacityWeight(a *contract.Account, h *contract.AccountHealth) float64 {
	if h != nil && h.DailyCap > 0 {
		return float64(h.Remaining())
	}
	if a.DailyCap > 0 {
		return float64(a.DailyCap)
	}
	return a.RatePerSec * 86400
}

// mix64 is MurmurHash3's 64-bit finalizer. FNV-1a alone barely changes its
// high bits between names that differ in their last characters
// ("share-1", "share-2"), and the score uses the high bits: without it six
// equal accounts got recipients in a 0/0/0/0/1/2 ratio.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
