package pipelinetest

import (
	"fmt"

	"github.com/broadcastd/broadcast/contract"
)

// Recipients builds n recipients named prefix-0000, prefix-0001, ...
func Recipients(prefix string, n int) []contract.Recipient {
	out := make([]contract.Recipient, n)
	for i := range out {
		out[i] = contract.Recipient{To: fmt.Sprintf("%s-%04d", prefix, i)}
	}
	return out
}

// RecipientsWithRejects builds n recipients named user-0000, user-0001,
// ..., except that those whose index i has i%every == at are named bad-NNNN
// (which a gateway run with -permanent-prefix bad- rejects); it also
// returns how many of those there are.
func RecipientsWithRejects(n, every, at int) (rs []contract.Recipient, rejected int) {
	for i := range n {
		to := fmt.Sprintf("user-%04d", i)
		if i%every == at {
			to = fmt.Sprintf("bad-%04d", i)
			rejected++
		}
		rs = append(rs, contract.Recipient{To: to})
	}
	return rs, rejected
}
