package shared

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// PublishEvent stores ev on its subject and waits for the stream's ack. The
// event's MsgID makes a republished outcome a no-op within the duplicate
// window; status counts exactly beyond it.
func PublishEvent(ctx context.Context, js jetstream.JetStream, ev *contract.Event) error {
	subject, data, err := eventMessage(ev)
	if err != nil {
		return err
	}
	_, err = js.Publish(ctx, subject, data, publishOpts(ev)...)
	return err
}

// PublishEventAsync is PublishEvent without waiting; the caller waits on the
// returned future (or on js.PublishAsyncComplete).
func PublishEventAsync(js jetstream.JetStream, ev *contract.Event) (jetstream.PubAckFuture, error) {
	subject, data, err := eventMessage(ev)
	if err != nil {
		return nil, err
	}
	return js.PublishAsync(subject, data, publishOpts(ev)...)
}

// PublishEvent is PublishEventAsync through a Publisher (the hot paths).
func (p *Publisher) PublishEvent(ctx context.Context, ev *contract.Event) (*Publication, error) {
	subject, data, err := eventMessage(ev)
	if err != nil {
		return nil, err
	}
	return p.Publish(ctx, subject, data, publishMsgID(ev))
}

// eventMessage stamps ev (when it has no time yet) and gives its subject
// and encoding.
func eventMessage(ev *contract.Event) (subject string, data []byte, err error) {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	data, err = contract.EncodeEvent(ev)
	return contract.EventSubject(ev.TaskID, ev.Kind), data, err
}

// publishOpts gives an event its Nats-Msg-Id (publishMsgID).
func publishOpts(ev *contract.Event) []jetstream.PublishOpt {
	if id := publishMsgID(ev); id != "" {
		return []jetstream.PublishOpt{jetstream.WithMsgID(id)}
	}
	return nil
}

// publishMsgID is an event's Nats-Msg-Id, none for a sent event: dispatch
// publishes one only after looking for it among the stored sent events (a
// redelivered job whose sent event is stored is acknowledged without
// publishing again; see the sent index in dispatch), so the stream's
// duplicate check has nothing to catch, and it cost a tenth of the
// pipeline's CPU (the header on both sides, the server's window of ids).
func publishMsgID(ev *contract.Event) string {
	if ev.Kind == contract.EventSent {
		return ""
	}
	return ev.MsgID()
}
