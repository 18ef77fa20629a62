package status

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// receiptLog is a finished task of n recipients: every fifth skipped, the
// rest sent, then receipts per sent recipient by i%6: 0 delivered, 1
// delivered then read, 2 undelivered, 3 undelivered then delivered (a
// second device), 4 read only, 5 none (a blocked user stays at sent).
func receiptLog(n int) (sends, receipts []*contract.Event) {
	sends = append(sends, &contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: n, At: time.Now()})
	for i := range n {
		if i%5 == 0 {
			sends = append(sends, ev(contract.EventSkipped, i, 0))
			continue
		}
		sends = append(sends, ev(contract.EventSent, i, 1))
		switch i % 6 {
		case 0:
			receipts = append(receipts, ev(contract.EventDelivered, i, 1))
		case 1:
			receipts = append(receipts, ev(contract.EventDelivered, i, 1), ev(contract.EventRead, i, 1))
		case 2:
			receipts = append(receipts, ev(contract.EventUndelivered, i, 1))
		case 3:
			receipts = append(receipts, ev(contract.EventUndelivered, i, 1), ev(contract.EventDelivered, i, 1))
		case 4:
			receipts = append(receipts, ev(contract.EventRead, i, 1))
		}
	}
	return sends, receipts
}

// wantReceipts counts what receiptLog's rule gives.
func wantReceipts(n int) (delivered, read, undelivered int) {
	for i := range n {
		if i%5 == 0 {
			continue
		}
		switch i % 6 {
		case 0, 3:
			delivered++
		case 1, 4:
			delivered++
			read++
		case 2:
			undelivered++
		}
	}
	return
}

// TestFoldReceiptsAreExactInAnyOrder folds the receipts of a finished
// task shuffled, with duplicates, and checks the counts follow the rule
// (max over undelivered < delivered < read) whatever the order.
func TestFoldReceiptsAreExactInAnyOrder(t *testing.T) {
	t.Parallel()
	const n = 600
	sends, receipts := receiptLog(n)
	wd, wr, wu := wantReceipts(n)
	require.Equal(t, [3]int{320, 160, 80}, [3]int{wd, wr, wu}, "the log's shape")
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 30 {
		f := newFold("t")
		for _, e := range sends {
			f.apply(e)
		}
		require.Equal(t, contract.StatePartial, f.P.State)
		shuffled := append([]*contract.Event(nil), receipts...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		for _, e := range shuffled {
			f.apply(e)
			if rng.IntN(3) == 0 {
				f.apply(shuffled[rng.IntN(len(shuffled))])
			}
		}
		require.Equal(t, wd, f.P.Delivered, "round %d delivered", round)
		require.Equal(t, wr, f.P.Read, "round %d read", round)
		require.Equal(t, wu, f.P.Undelivered, "round %d undelivered", round)
		require.LessOrEqual(t, f.P.Delivered+f.P.Undelivered, f.P.Sent)
		require.Equal(t, 480, f.P.Sent, "receipts never change sent")
		require.Equal(t, contract.StatePartial, f.P.State, "receipts never change the state")
	}
}

// TestFoldReceiptRules checks the rule one recipient at a time.
func TestFoldReceiptRules(t *testing.T) {
	t.Parallel()
	counts := func(kinds ...contract.EventKind) [3]int {
		f := newFold("t")
		f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 2, At: time.Now()})
		f.apply(ev(contract.EventSent, 0, 1))
		for _, k := range kinds {
			f.apply(ev(k, 0, 1))
		}
		return [3]int{f.P.Delivered, f.P.Read, f.P.Undelivered}
	}
	D, R, U := contract.EventDelivered, contract.EventRead, contract.EventUndelivered
	require.Equal(t, [3]int{1, 0, 0}, counts(D))
	require.Equal(t, [3]int{1, 0, 0}, counts(D, D, D))
	require.Equal(t, [3]int{0, 0, 1}, counts(U))
	require.Equal(t, [3]int{1, 0, 0}, counts(U, D), "delivered after failed: positive evidence wins")
	require.Equal(t, [3]int{1, 0, 0}, counts(D, U), "failed after delivered changes nothing")
	require.Equal(t, [3]int{1, 1, 0}, counts(R), "read implies delivered")
	require.Equal(t, [3]int{1, 1, 0}, counts(R, D, U))
	require.Equal(t, [3]int{1, 1, 0}, counts(U, R))

	// Receipts for a recipient that was not sent, a test recipient or an
	// index beyond total count nothing.
	f := newFold("t")
	f.apply(&contract.Event{TaskID: "t", Kind: contract.EventAccepted, Index: -1, Total: 2, At: time.Now()})
	f.apply(ev(contract.EventSkipped, 0, 0))
	f.apply(ev(D, 0, 1))
	f.apply(ev(D, 5, 1))
	f.apply(&contract.Event{TaskID: "t", JobID: contract.JobID("t", 1, true), Kind: D, Index: 1, At: time.Now()})
	require.Equal(t, [3]int{0, 0, 0}, [3]int{f.P.Delivered, f.P.Read, f.P.Undelivered})
}

// TestFoldReceiptStateSurvivesCheckpoint: the receipt state goes through
// the checkpoint's JSON, so a duplicate folded after a reload changes
// nothing, and a checkpoint written before receipts existed still loads.
func TestFoldReceiptStateSurvivesCheckpoint(t *testing.T) {
	t.Parallel()
	const n = 60
	sends, receipts := receiptLog(n)
	f := newFold("t")
	for _, e := range append(sends, receipts...) {
		f.apply(e)
	}
	data, err := json.Marshal(f)
	require.NoError(t, err)
	g := newFold("t")
	require.NoError(t, json.Unmarshal(data, g))
	for _, e := range receipts {
		require.False(t, g.apply(e), "a receipt folded again after the reload changes nothing")
	}
	wd, wr, wu := wantReceipts(n)
	require.Equal(t, [3]int{wd, wr, wu}, [3]int{g.P.Delivered, g.P.Read, g.P.Undelivered})

	// An old checkpoint: no receipts field, no receipt counts.
	var old map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(data, &old))
	delete(old, "receipts")
	var prog map[string]any
	require.NoError(t, json.Unmarshal(old["progress"], &prog))
	delete(prog, "delivered")
	delete(prog, "read")
	delete(prog, "undelivered")
	old["progress"], _ = json.Marshal(prog)
	data, _ = json.Marshal(old)
	h := newFold("t")
	require.NoError(t, json.Unmarshal(data, h))
	require.Nil(t, h.Receipts)
	require.Equal(t, 48, h.P.Sent)
	h.apply(ev(contract.EventRead, 1, 1))
	h.apply(ev(contract.EventUndelivered, 2, 1))
	require.Equal(t, [3]int{1, 1, 1}, [3]int{h.P.Delivered, h.P.Read, h.P.Undelivered})
}
