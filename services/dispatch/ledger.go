package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/shared"
)

// ledgerEntry records that a job was accepted by its provider. Its presence
// is what stops a redelivered job from being sent again.
type ledgerEntry struct {
	State      string    `json:"state"`
	Account    string    `json:"account"`
	Attempt    int       `json:"attempt"`
	ProviderID string    `json:"provider_id,omitempty"`
	At         time.Time `json:"at"`
}

// sentBefore returns the ledger entry of a job already sent, or nil.
func (s *Service) sentBefore(ctx context.Context, job *shared.Job) (*ledgerEntry, error) {
	e, err := s.ledger.Get(ctx, job.LedgerKey())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var le ledgerEntry
	if err := json.Unmarshal(e.Value(), &le); err != nil || le.State != "sent" {
		return nil, nil
	}
	return &le, nil
}

// recordSent writes the ledger entry after the provider accepted the job.
func (s *Service) recordSent(ctx context.Context, job *shared.Job, le ledgerEntry) error {
	le.State = "sent"
	data, _ := json.Marshal(le)
	_, err := s.ledger.Put(ctx, job.LedgerKey(), data)
	return err
}
