package shared

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/broadcastd/broadcast/contract"
	"github.com/stretchr/testify/require"
)

// TestPickAccountSpreadsEvenly: equal accounts with similar names get
// similar numbers of similar recipients, an account with twice the rate
// gets about twice as many, and a recipient always lands on one account.
func TestPickAccountSpreadsEvenly(t *testing.T) {
	var pool []*contract.Account
	for i := range 6 {
		pool = append(pool, &contract.Account{Name: fmt.Sprintf("share-%d", i), RatePerSec: 100})
	}
	const n = 12_000
	count := map[string]int{}
	for i := range n {
		to := fmt.Sprintf("s%d", i)
		a := PickAccount(pool, to, nil)
		if again := PickAccount(pool, to, nil); again != a {
			t.Fatalf("%s went to %s, then %s", to, a.Name, again.Name)
		}
		count[a.Name]++
	}
	t.Logf("equal accounts: %v", count)
	for _, a := range pool {
		if c := count[a.Name]; c < n/6*8/10 || c > n/6*12/10 {
			t.Errorf("%s got %d of %d, want %d ± 20%%", a.Name, c, n, n/6)
		}
	}

	pool[0].RatePerSec = 200
	count = map[string]int{}
	for i := range n {
		count[PickAccount(pool, fmt.Sprintf("s%d", i), nil).Name]++
	}
	ratio := float64(count["share-0"]) / (float64(n-count["share-0"]) / 5)
	t.Logf("share-0 at twice the rate: %v (ratio %.2f)", count, ratio)
	if ratio < 1.7 || ratio > 2.3 {
		t.Errorf("an account with twice the rate got %.2f times an equal one's share, want about 2", ratio)
	}
}

// referencePick is PickAccount as first written, with hash/fnv per
// candidate and a logarithm for every score: Picker must choose alike.
func referencePick(candidates []*contract.Account, to string) *contract.Account {
	var best *contract.Account
	bestScore := math.Inf(-1)
	for _, a := range candidates {
		w := capacityWeight(a, nil)
		if w <= 0 {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(a.Name))
		h.Write([]byte{0})
		h.Write([]byte(to))
		u := (float64(mix64(h.Sum64())>>11) + 0.5) / (1 << 53)
		if score := -w / math.Log(u); score > bestScore {
			best, bestScore = a, score
		}
	}
	return best
}

// TestPickerMatchesRendezvous: with equal weights (the path without
// logarithms) and with unequal ones, every recipient gets the account the
// plain weighted rendezvous hash gives it.
func TestPickerMatchesRendezvous(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, equal := range []bool{true, false} {
		var pool []*contract.Account
		for i := range 50 {
			rate := 100.0
			if !equal {
				rate = float64(1 + r.IntN(500))
			}
			pool = append(pool, &contract.Account{Name: fmt.Sprintf("acct-%d", i), RatePerSec: rate})
		}
		p := NewPicker(pool, nil)
		require.Equal(t, equal, p.equal)
		for i := range 5000 {
			to := fmt.Sprintf("+86138%08d", i)
			require.Same(t, referencePick(pool, to), p.Pick(to), "%s (equal weights %v)", to, equal)
		}
	}
}

// BenchmarkPick1000Accounts: one recipient's pick among 1,000 accounts,
// through a Picker (render's batches) and through PickAccount.
func BenchmarkPick1000Accounts(b *testing.B) {
	var pool []*contract.Account
	for i := range 1000 {
		pool = append(pool, &contract.Account{Name: fmt.Sprintf("bench-1764620000000000000-%d", i), RatePerSec: 15})
	}
	b.Run("picker", func(b *testing.B) {
		p := NewPicker(pool, nil)
		for i := 0; b.Loop(); i++ {
			p.Pick(fmt.Sprintf("+8613%09d", i))
		}
	})
	b.Run("reference", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			referencePick(pool, fmt.Sprintf("+8613%09d", i))
		}
	})
}
