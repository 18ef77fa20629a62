package lease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/broadcastd/broadcast/contract"
)

// A replica answers on its alive subject (contract.AliveSubject) while its
// connection is up. A standby that finds a lease held asks the holder's
// subject: "no responders" means the server has closed the holder's
// connection (a killed process's socket closes with it), so the lease is
// taken at once instead of after its TTL. A holder whose own connection is
// down counts its lease as invalid until a refresh succeeds again
// (Lease.Valid), so a standby taking over then never works beside it.
//
// Any other answer, or none in time, counts as alive: only the server's
// word that nobody listens takes a lease early. That word is asked afresh
// each time, after the lease's revision was read: after a server restart
// a holder only slow to reconnect also has nobody listening for a moment,
// and once it is back and has confirmed its lease (a new revision) an
// earlier "gone" would take the lease from a holder that counts it valid
// for seconds.

// PresenceCache is how long an "alive" answer about a replica is reused:
// a standby asks once per live holder, not once per lease.
const PresenceCache = Refresh / 2

// presenceTimeout bounds one question.
const presenceTimeout = 500 * time.Millisecond

// Presence answers for this process and asks about others, on the alive
// subjects of one service.
type Presence struct {
	nc      *nats.Conn
	service string

	mu   sync.Mutex
	seen map[string]presenceAnswer // replica token -> last answer
}

type presenceAnswer struct {
	gone bool
	at   time.Time
}

// NewPresence is the presence of service's replicas on nc.
func NewPresence(nc *nats.Conn, service string) *Presence {
	return &Presence{nc: nc, service: service, seen: map[string]presenceAnswer{}}
}

// ReplicaToken is the part of a replica id (host/pid/random, NewReplicaID)
// or owner id (replica/seq, OwnerID) that names the replica in subjects:
// its random hex part. It is "" for an id of another shape.
func ReplicaToken(id string) string {
	parts := strings.Split(id, "/")
	if len(parts) != 3 && len(parts) != 4 {
		return ""
	}
	return parts[2]
}

// Answer subscribes replica's alive subject; the returned function
// unsubscribes. Subscribe it before taking any lease.
func (p *Presence) Answer(replica string, log *slog.Logger) (func(), error) {
	sub, err := p.nc.Subscribe(contract.AliveSubject(p.service, ReplicaToken(replica)), func(m *nats.Msg) {
		_ = m.Respond(nil)
	})
	if err != nil {
		return nil, err
	}
	if err := p.nc.Flush(); err != nil {
		log.Warn("alive subject not confirmed by the server yet", "err", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// Gone reports whether the server says the replica holding owner's lease
// has no connection now: an "alive" answer of the last PresenceCache is
// reused, a "gone" one never.
func (p *Presence) Gone(ctx context.Context, owner string) bool {
	token := ReplicaToken(owner)
	if token == "" {
		return false
	}
	p.mu.Lock()
	a, ok := p.seen[token]
	p.mu.Unlock()
	if ok && !a.gone && time.Since(a.at) < PresenceCache {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	_, err := p.nc.RequestWithContext(ctx, contract.AliveSubject(p.service, token), nil)
	a = presenceAnswer{gone: errors.Is(err, nats.ErrNoResponders), at: time.Now()}
	p.mu.Lock()
	p.seen[token] = a
	if len(p.seen) > 1024 {
		for k, v := range p.seen {
			if time.Since(v.at) >= PresenceCache {
				delete(p.seen, k)
			}
		}
	}
	p.mu.Unlock()
	return a.gone
}
