package status

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// seqMsg is a delivered event with the given sequences.
type seqMsg struct {
	jetstream.Msg
	seq jetstream.SequencePair
}

func (m seqMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: m.seq}, nil
}

// TestInSequence: the fold takes an event only as the delivery right
// after the last one and later in the stream; a gap (a delivery lost on
// its way) or an older event (a redelivery after the ack wait, behind
// newer ones) sends it back to the acknowledgement floor.
func TestInSequence(t *testing.T) {
	pair := func(c, s uint64) jetstream.SequencePair { return jetstream.SequencePair{Consumer: c, Stream: s} }
	for _, tc := range []struct {
		name       string
		last, next jetstream.SequencePair
		ok         bool
	}{
		{"first after a reset", pair(0, 0), pair(1, 40), true},
		{"next", pair(1, 40), pair(2, 41), true},
		{"next, after events of other subjects", pair(2, 41), pair(3, 57), true},
		{"a delivery lost", pair(2, 41), pair(4, 43), false},
		{"the first after a reset lost", pair(0, 0), pair(2, 41), false},
		{"a redelivery of an older event", pair(3, 57), pair(4, 41), false},
		{"the same event again", pair(3, 57), pair(4, 57), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := inSequence(seqMsg{seq: tc.next}, tc.last)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.next, got)
		})
	}
}
