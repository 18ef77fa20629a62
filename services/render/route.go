package render

import (
	"hash/fnv"

	"github.com/broadcastd/broadcast/shared"
)

// pickAccount chooses the sender account for a recipient. Hashing the
// address keeps a recipient on one account across tasks, so per-recipient
// gaps are enforced where the sends happen.
func pickAccount(accounts []*shared.Account, to string) *shared.Account {
	if len(accounts) == 1 {
		return accounts[0]
	}
	h := fnv.New32a()
	h.Write([]byte(to))
	return accounts[int(h.Sum32()%uint32(len(accounts)))]
}
