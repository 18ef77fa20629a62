package status

import (
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/shared"
)

// index publishes a recipient's outcome to the recipient index (stream
// LOOKUP, contract/lookup.go) when the fold changed it: one entry per
// recipient and outcome, keyed by the hash of the recipient in its
// channel-independent form, so GET /api/lookup reads one subject.
// Published asynchronously and not awaited (the fold must not wait on
// it); a loss is repaired when the event is folded again after a crash,
// and the message id drops what the stream has already. Call with s.mu
// held.
func (s *Service) index(ev *contract.Event, changed bool) {
	if !changed || ev.Index < 0 || ev.To == "" {
		return
	}
	switch ev.Kind {
	case contract.EventSent, contract.EventFailed, contract.EventSkipped, contract.EventExpired,
		contract.EventCancelled, contract.EventDelivered, contract.EventRead, contract.EventUndelivered:
	default:
		return
	}
	to, err := suppress.Normalize(contract.ScopeAll, ev.To)
	if err != nil {
		return
	}
	data, _ := json.Marshal(contract.LookupEntry{TaskID: ev.TaskID, JobID: ev.JobID, To: ev.To, Account: ev.Account,
		Kind: ev.Kind, Attempt: ev.Attempt, Code: ev.Code, Error: ev.Error, At: ev.At})
	id := fmt.Sprintf("%s:%d:%s:%d", ev.TaskID, ev.Index, ev.Kind, ev.Generation)
	if _, err := s.js.PublishAsync(contract.LookupSubject(contract.RecipientHash(to)), data, jetstream.WithMsgID(id)); err != nil {
		s.log.Debug("recipient index entry not published", shared.KeyTaskID, ev.TaskID, "err", err)
	}
}
