package dispatch

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
// connection is up. A standby that finds an account's lease held asks the
// holder's subject: "no responders" means the server has closed the
// holder's connection (a killed process's socket closes with it), so the
// lease is taken at once instead of after its TTL. A holder whose own
// connection is down counts its lease as invalid until a refresh succeeds
// again (lease.valid), so a standby taking over then never sends beside it.
//
// Any other answer, or none in time, counts as alive: only the server's
// word that nobody listens takes a lease early.

// presenceCache is how long an answer about a replica is reused: a standby
// asks once per holder, not once per account.
const presenceCache = leaseRefresh / 2

// presenceTimeout bounds one question.
const presenceTimeout = 500 * time.Millisecond

type presence struct {
	nc *nats.Conn

	mu   sync.Mutex
	seen map[string]presenceAnswer // replica token -> last answer
}

type presenceAnswer struct {
	gone bool
	at   time.Time
}

func newPresence(nc *nats.Conn) *presence {
	return &presence{nc: nc, seen: map[string]presenceAnswer{}}
}

// replicaToken is the part of a replica id (host/pid/random, newReplicaID)
// or owner id (replica/seq, ownerID) that names the replica in subjects: its
// random hex part. It is "" for an id of another shape.
func replicaToken(id string) string {
	parts := strings.Split(id, "/")
	if len(parts) != 3 && len(parts) != 4 {
		return ""
	}
	return parts[2]
}

// answer subscribes this replica's alive subject; the returned function
// unsubscribes.
func (p *presence) answer(replica string, log *slog.Logger) (func(), error) {
	sub, err := p.nc.Subscribe(contract.AliveSubject("dispatch", replicaToken(replica)), func(m *nats.Msg) {
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

// gone reports whether the server says the replica holding owner's lease
// has no connection.
func (p *presence) gone(ctx context.Context, owner string) bool {
	token := replicaToken(owner)
	if token == "" {
		return false
	}
	p.mu.Lock()
	a, ok := p.seen[token]
	p.mu.Unlock()
	if ok && time.Since(a.at) < presenceCache {
		return a.gone
	}
	ctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	_, err := p.nc.RequestWithContext(ctx, contract.AliveSubject("dispatch", token), nil)
	a = presenceAnswer{gone: errors.Is(err, nats.ErrNoResponders), at: time.Now()}
	p.mu.Lock()
	p.seen[token] = a
	if len(p.seen) > 1024 {
		for k, v := range p.seen {
			if time.Since(v.at) >= presenceCache {
				delete(p.seen, k)
			}
		}
	}
	p.mu.Unlock()
	return a.gone
}
