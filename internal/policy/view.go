package policy

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// View is a live copy of KV broadcast_policy; edits apply within a
// watch's delay. A value that does not validate is logged with its key
// and field and treated as absent (for a channel key: the default then
// applies).
type View struct {
	kv *shared.KVView[*contract.Policy]
}

// Watch follows KV broadcast_policy and returns once its current values
// are loaded.
func Watch(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*View, error) {
	kv, err := shared.WatchKV(ctx, js, contract.BucketPolicy, contract.DecodePolicy, log, nil)
	if err != nil {
		return nil, err
	}
	return &View{kv: kv}, nil
}

// For returns the policy of channel: its own key's when present, else the
// default, else nil (no policy). A nil view has none.
func (v *View) For(channel string) *contract.Policy {
	if v == nil {
		return nil
	}
	if p, ok := v.kv.Get(channel); ok {
		return p
	}
	if p, ok := v.kv.Get(contract.PolicyDefault); ok {
		return p
	}
	return nil
}
