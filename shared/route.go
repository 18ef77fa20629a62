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
// taken once, so a recipient costs one pass of arithmetic over them (a
// task over 1,000 accounts spent most of render's time in PickAccount).
type Picker struct {
	candidates []*contract.Account
	weights    []float64 // capacityWeight; <= 0: out of capacity
	prefixes   []uint64  // FNV-1a of the name and a zero byte
	equal      bool      // every weight the same and positive
}

// NewPicker prepares picks among candidates, with their health as it is
// now (health may be nil).
func NewPicker(candidates []*contract.Account, health *HealthWatcher) *Picker {
	p := &Picker{candidates: candidates, weights: make([]float64, len(candidates)), prefixes: make([]uint64, len(candidates)), equal: true}
	for i, a := range candidates {
		p.weights[i] = capacityWeight(a, health.Get(a.Name))
		p.prefixes[i] = fnvByte(fnvString(fnvOffset64, a.Name), 0)
		if p.weights[i] <= 0 || p.weights[i] != p.weights[0] {
			p.equal = false
		}
	}
	return p
}

// Pick returns the account for recipient to (nil without candidates).
func (p *Picker) Pick(to string) *contract.Account {
	switch len(p.candidates) {
	case 0:
		return nil
	case 1:
		return p.candidates[0]
	}
	best := -1
	if p.equal {
		// With one weight the highest score is the highest u: no logarithm.
		var bestU uint64
		for i, prefix := range p.prefixes {
			if u := mix64(fnvString(prefix, to)) >> 11; best < 0 || u > bestU {
				best, bestU = i, u
			}
		}
		return p.candidates[best]
	}
	bestScore := math.Inf(-1)
	for i, prefix := range p.prefixes {
		w := p.weights[i]
		if w <= 0 {
			continue
		}
		// Map the hash to (0,1) and score it: -w/ln(u) is the classic
		// weighted rendezvous score.
		u := (float64(mix64(fnvString(prefix, to))>>11) + 0.5) / (1 << 53)
		if score := -w / math.Log(u); score > bestScore {
			best, bestScore = i, score
		}
	}
	if best < 0 { // every account is out of capacity: spread evenly
		h := fnv.New32a()
		h.Write([]byte(to))
		return p.candidates[int(h.Sum32()%uint32(len(p.candidates)))]
	}
	return p.candidates[best]
}

// FNV-1a, 64 bits, as hash/fnv computes it, continued from a given state.
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = fnvByte(h, s[i])
	}
	return h
}

func fnvByte(h uint64, b byte) uint64 { return (h ^ uint64(b)) * fnvPrime64 }

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
