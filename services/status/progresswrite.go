package status

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// A task's progress is written only over the revision its writer last
// wrote or read (KV Update), not over whatever is there (Put). A write
// checked against the fold lease can still reach the server late: made
// just before the connection dropped, it waits in the client's reconnect
// buffer and goes out after the reconnect, when the replica that took the
// partition over may have written newer progress. As a Put it replaced
// that progress with older values, and for a finished task nothing wrote
// over it again. Fenced by revision, it is refused.

// writeProgress writes prog as f's task's progress over the revision
// f.rev (reading it first when unknown). A revision moved by someone else
// while the lease is confirmed valid is a former holder's write that came
// late: read again and written over, as this fold holds every event that
// one folded (its checkpoint was saved before its progress). Otherwise
// the write stops with errNotConfirmed. f.rev is only used by the
// partition's fold loop.
func (s *Service) writeProgress(ctx context.Context, p *partition, f *taskFold, prog []byte) error {
	id := f.P.TaskID
	for tries := 0; ; tries++ {
		if f.rev == 0 {
			e, err := s.progress.Get(ctx, id)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				rev, err := s.progress.Create(ctx, id, prog)
				if err == nil {
					f.rev = rev
					return nil
				}
				if !errors.Is(err, jetstream.ErrKeyExists) {
					return err
				}
				continue // created meanwhile: read its revision
			case err != nil:
				return err
			}
			f.rev = e.Revision()
		}
		rev, err := s.progress.Update(ctx, id, prog, f.rev)
		if err == nil {
			f.rev = rev
			return nil
		}
		f.rev = 0
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || tries >= maxProgressWriteTries {
			return err
		}
		if !p.mayWrite() {
			return errNotConfirmed
		}
	}
}

// maxProgressWriteTries bounds the writes over a moved revision in one
// flush; a late write of a former holder moves it once.
const maxProgressWriteTries = 3
