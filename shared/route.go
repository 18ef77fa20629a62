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
	if len(candidates) == 0 {
		return nil
	}
	if len(candidates) == 1 {
		return candidates[0]
	}
	var best *contract.Account
	bestScore := math.Inf(-1)
	for _, a := range candidates {
		w := capacityWeight(a, health.Get(a.Name))
		if w <= 0 {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(a.Name))
		h.Write([]byte{0})
		h.Write([]byte(to))
		// Map the hash to (0,1) and score it: -w/ln(u) is the classic
		// weighted rendezvous score.
		u := (float64(mix64(h.Sum64())>>11) + 0.5) / (1 << 53)
		score := -w / math.Log(u)
		if score > bestScore {
			best, bestScore = a, score
		}
	}
	if best == nil { // every account is out of capacity: spread evenly
		h := fnv.New32a()
		h.Write([]byte(to))
		return candidates[int(h.Sum32()%uint32(len(candidates)))]
	}
	return best
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
