package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
)

// Lookup is what GET /api/lookup and `broadcast lookup` answer: every
// outcome the recipient index holds for one recipient, oldest first (the
// last contract.LookupKeptPerRecipient, within the events' retention).
type Lookup struct {
	// To is the recipient as asked; Normalized the form it was looked up by.
	To         string                 `json:"to"`
	Normalized string                 `json:"normalized"`
	Entries    []contract.LookupEntry `json:"entries"`
}

// LookupRecipient reads a recipient's entries from stream LOOKUP: one
// subject, the hash of the recipient normalized the way suppression
// scope "all" does it (E.164 for phone numbers, lower-cased e-mail
// addresses, others trimmed), so the cost is that recipient's entries
// only.
func LookupRecipient(ctx context.Context, js jetstream.JetStream, to string) (*Lookup, error) {
	n, err := suppress.Normalize(contract.ScopeAll, to)
	if err != nil {
		return nil, err
	}
	out := &Lookup{To: to, Normalized: n, Entries: []contract.LookupEntry{}}
	err = readSubject(ctx, js, contract.StreamLookup, contract.LookupSubject(contract.RecipientHash(n)), 0, func(_ uint64, data []byte) bool {
		var e contract.LookupEntry
		if json.Unmarshal(data, &e) == nil {
			out.Entries = append(out.Entries, e)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("lookup: %w", err)
	}
	return out, nil
}
