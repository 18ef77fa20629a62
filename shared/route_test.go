package shared

import (
	"fmt"
	"testing"

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
