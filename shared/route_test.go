package shared

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
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

// referencePick is PickAccount written plainly, with hash/fnv per
// candidate and a logarithm for every score: Picker must choose alike.
func referencePick(candidates []*contract.Account, to string) *contract.Account {
	var best *contract.Account
	bestScore := math.Inf(-1)
	for _, a := range candidates {
		w := capacityWeight(a, nil)
		if w <= 0 {
			continue
		}
		ha, hr := fnv.New64a(), fnv.New64a()
		ha.Write([]byte(a.Name))
		hr.Write([]byte(to))
		u := (float64(mix64(mix64(ha.Sum64())^mix64(hr.Sum64()))>>11) + 0.5) / (1 << 53)
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

// balancedCounts picks n recipients over pool in batches of size, as
// render does (a Balancer per batch, slack percent over the shares), and
// returns each account's count and how many recipients left their
// rendezvous account.
func balancedCounts(pool []*contract.Account, n, size, slack int) (map[string]int, int) {
	p := NewPicker(pool, nil)
	count, moved := map[string]int{}, 0
	for first := 0; first < n; first += size {
		m := min(size, n-first)
		b := p.Balance(m, slack)
		for i := first; i < first+m; i++ {
			to := fmt.Sprintf("+8613%09d", i)
			a := b.Pick(to)
			if a != p.Pick(to) {
				moved++
			}
			count[a.Name]++
		}
	}
	return count, moved
}

func busiest(count map[string]int) int {
	most := 0
	for _, c := range count {
		most = max(most, c)
	}
	return most
}

// TestBalancerBoundsTheBusiestAccount: 60,000 recipients over 1,000 equal
// accounts in render's batches of 16 per account (16,000). Hashing alone
// gives the busiest account half as much again as the mean (which sets a
// paced task's time); balanced without slack every account gets exactly
// its share, and about 1 recipient in 7 leaves its usual account; with a
// slack of 10 % the busiest gets its share of each batch plus a tenth
// and fewer move. Over 3 accounts (batches of 500) few move either way.
func TestBalancerBoundsTheBusiestAccount(t *testing.T) {
	pool := func(k int) []*contract.Account {
		var out []*contract.Account
		for i := range k {
			out = append(out, &contract.Account{Name: fmt.Sprintf("bench-%d", i), RatePerSec: 15})
		}
		return out
	}
	const n = 60_000
	many := pool(1000)
	hashed := map[string]int{}
	p := NewPicker(many, nil)
	for i := range n {
		hashed[p.Pick(fmt.Sprintf("+8613%09d", i)).Name]++
	}
	require.GreaterOrEqual(t, busiest(hashed), 80, "hashing alone should leave the busiest well over the mean of 60")

	count, moved := balancedCounts(many, n, 16_000, 0)
	t.Logf("1,000 accounts, slack 0: busiest %d hashed, %d balanced (mean %d); %d of %d moved", busiest(hashed), busiest(count), n/1000, moved, n)
	for name, c := range count {
		require.Equal(t, n/1000, c, "%s: every account its share", name)
	}
	require.Len(t, count, 1000)
	require.Less(t, moved, n/6, "a sixth or more of the recipients left their rendezvous account")

	count, movedSlack := balancedCounts(many, n, 16_000, 10)
	// Batches 16,000 / 16,000 / 16,000 / 12,000: caps 18 / 18 / 18 / 14.
	t.Logf("1,000 accounts, slack 10: busiest %d; %d of %d moved", busiest(count), movedSlack, n)
	require.LessOrEqual(t, busiest(count), 18+18+18+14)
	require.Greater(t, busiest(count), n/1000, "the slack is taken")
	require.Less(t, movedSlack, n/10)
	require.Less(t, movedSlack, moved, "the slack keeps more recipients on their account")

	few := pool(3)
	count, moved = balancedCounts(few, n, 500, 0)
	t.Logf("3 accounts, slack 0: busiest %d (mean %d); %d of %d moved", busiest(count), n/3, moved, n)
	require.LessOrEqual(t, busiest(count), 120*167, "at most a share of each batch, rounded up")
	require.Less(t, moved, n/25)
	count, moved = balancedCounts(few, n, 500, 10)
	t.Logf("3 accounts, slack 10: busiest %d (mean %d); %d of %d moved", busiest(count), n/3, moved, n)
	require.Less(t, moved, n/100)

	// Twice the rate, twice the share: the caps follow the weights.
	few[0].RatePerSec = 30
	count, _ = balancedCounts(few, n, 500, 0)
	ratio := float64(count["bench-0"]) / (float64(n-count["bench-0"]) / 2)
	require.InDelta(t, 2, ratio, 0.05, "counts %v", count)
}

// TestBalancerRepeatsItsPicks: the same batch picked again (a render
// batch redelivered) lands every recipient where it did the first time.
func TestBalancerRepeatsItsPicks(t *testing.T) {
	var pool []*contract.Account
	for i := range 50 {
		pool = append(pool, &contract.Account{Name: fmt.Sprintf("acct-%d", i), RatePerSec: float64(10 + i)})
	}
	p := NewPicker(pool, nil)
	first, again := p.Balance(800, 0), p.Balance(800, 0)
	moved := 0
	for i := range 800 {
		to := fmt.Sprintf("+8613%09d", i)
		a := first.Pick(to)
		require.Same(t, a, again.Pick(to), to)
		if a != p.Pick(to) {
			moved++
		}
	}
	require.Positive(t, moved, "800 recipients over 50 accounts should overflow some account")

	// A batch sized for one recipient gives every account a cap of one:
	// the first 50 picks fill them, and picks beyond that go where Pick
	// sends them.
	one := p.Balance(1, 0)
	for i := range 50 {
		require.NotNil(t, one.Pick(fmt.Sprintf("fill-%d", i)))
	}
	for i := range 50 {
		to := fmt.Sprintf("extra-%d", i)
		require.Same(t, p.Pick(to), one.Pick(to), to)
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
