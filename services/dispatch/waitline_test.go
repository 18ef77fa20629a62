package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWaitLineKeepsPlaces: tickets are served in the order they joined; one
// that left and joins again takes its place back; one that left and stays
// away is skipped.
func TestWaitLineKeepsPlaces(t *testing.T) {
	t.Parallel()
	var l waitLine
	tk := make([]*ticket, 4)
	for i := range tk {
		tk[i] = &ticket{seq: uint64(i)}
		l.join(tk[i])
	}
	l.leave(tk[0]) // timed out; its job is checked and waits again
	l.leave(tk[1]) // timed out; its job is handled otherwise
	require.Equal(t, 2, l.len())
	l.join(tk[0])
	l.join(tk[0]) // joining twice counts once
	require.Equal(t, 3, l.len())
	var order []uint64
	for t := l.pop(); t != nil; t = l.pop() {
		order = append(order, t.seq)
	}
	require.Equal(t, []uint64{0, 2, 3}, order)
	require.Zero(t, l.len())
	require.Nil(t, l.front())
	require.Empty(t, l.tickets)
}

// TestWaitLineDropsTicketsThatLeft: tickets that leave and never come back
// do not pile up while nobody is served.
func TestWaitLineDropsTicketsThatLeft(t *testing.T) {
	t.Parallel()
	var l waitLine
	stays := &ticket{}
	l.join(stays)
	for range 10_000 {
		tk := &ticket{}
		l.join(tk)
		l.leave(tk)
	}
	require.Equal(t, 1, l.len())
	require.LessOrEqual(t, len(l.tickets), 130, "the slice is compacted")
	require.Same(t, stays, l.pop())
}
