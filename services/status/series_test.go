package status

import (
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

func seriesAt(limit int, now *time.Time) *seriesStore {
	st := newSeriesStore(limit)
	st.now = func() time.Time { return *now }
	return st
}

func TestSeriesCountsPerSecondAndPerMinute(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 30, 0, time.UTC)
	st := seriesAt(8, &now)
	ev := func(kind contract.EventKind, ago time.Duration) {
		st.record(&contract.Event{TaskID: "t1", Account: "a1", Kind: kind, Index: 0, At: now.Add(-ago)})
	}
	for range 5 {
		ev(contract.EventSent, 2*time.Second)
	}
	ev(contract.EventRetrying, 2*time.Second)
	ev(contract.EventFailed, 0)
	ev(contract.EventDelivered, 0)
	ev(contract.EventSent, 90*time.Second)                                                     // the minute before
	ev(contract.EventSent, 25*time.Hour)                                                       // older than a day: not counted
	ev(contract.EventAccepted, time.Second)                                                    // not charted
	st.record(&contract.Event{TaskID: "t1", Kind: contract.EventSent, At: now.Add(time.Hour)}) // future: now

	v, ok := st.view("t1", false, 10)
	require.True(t, ok)
	require.Equal(t, "t1", v.Task)
	ps := v.PerSecond
	require.Equal(t, now.Add(-9*time.Second), ps.Start, "ten seconds up to now")
	require.Len(t, ps.Sent, 10)
	require.Equal(t, uint32(5), ps.Sent[7], "two seconds ago")
	require.Equal(t, uint32(1), ps.Retrying[7])
	require.Equal(t, uint32(1), ps.Failed[9])
	require.Equal(t, uint32(1), ps.Delivered[9])
	require.Equal(t, uint32(1), ps.Sent[9], "the future event counts now")
	var sum uint32
	for _, n := range ps.Sent {
		sum += n
	}
	require.Equal(t, uint32(6), sum, "the event 90 s ago is outside ten seconds")
	require.Nil(t, ps.RatePerSec, "tasks have no rate samples")

	pm := v.PerMinute
	require.Equal(t, 60, pm.StepSeconds)
	require.Equal(t, time.Date(2026, 12, 2, 9, 59, 0, 0, time.UTC), pm.Start, "from the first event's minute")
	require.Equal(t, []uint32{1, 6}, pm.Sent)

	a, ok := st.view("a1", true, 3600)
	require.True(t, ok)
	require.Equal(t, uint32(5), a.PerSecond.Sent[len(a.PerSecond.Sent)-3], "the account counts its own sends")
	require.Len(t, a.PerSecond.Sent, 91, "from its first event, 90 s ago")
	st.sampleAccount("a1", accountSample{rate: 12.5, ceiling: 50, queue: 7, dailyUsed: 120, dailyCap: 250})
	st.sampleAccount("nobody", accountSample{rate: 1}) // no series: nothing made
	a, _ = st.view("a1", true, 5)
	require.Equal(t, float32(12.5), a.PerSecond.RatePerSec[4])
	require.Equal(t, float32(50), a.PerSecond.Ceiling[4])
	require.Equal(t, uint32(7), a.PerSecond.QueueDepth[4])
	require.Equal(t, uint32(120), a.PerSecond.DailyUsed[4])
	require.Equal(t, uint32(250), a.PerSecond.DailyCap[4])
	require.Equal(t, uint32(250), a.PerMinute.DailyCap[len(a.PerMinute.DailyCap)-1], "the minute keeps its last sample")
	require.Equal(t, float32(0), a.PerSecond.RatePerSec[3], "no sample then")
	_, accounts := st.size()
	require.Equal(t, 1, accounts)
}

func TestSeriesRingForgetsTheHourBefore(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := seriesAt(8, &now)
	st.record(&contract.Event{TaskID: "t1", Kind: contract.EventSent, At: now})
	now = now.Add(time.Hour) // same slot of the per-second ring, an hour later
	st.record(&contract.Event{TaskID: "t1", Kind: contract.EventFailed, At: now})
	v, _ := st.view("t1", false, 3600)
	require.Len(t, v.PerSecond.Sent, 3600)
	last := len(v.PerSecond.Sent) - 1
	require.Equal(t, uint32(0), v.PerSecond.Sent[last], "the hour-old send left its slot")
	require.Equal(t, uint32(1), v.PerSecond.Failed[last])
	require.Equal(t, []uint32{1}, v.PerMinute.Sent[:1], "but stays in the per-minute ring")
	require.Len(t, v.PerMinute.Sent, 61)
}

// TestSeriesMemoryIsBounded: many tasks never make more than the limit
// of series; the ended task idle longest goes first; running ones stay
// while they had an event in the last evictAfter (a newcomer is then not
// charted, rather than all taking turns), and go once idle that long.
func TestSeriesMemoryIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := seriesAt(4, &now)
	send := func(task string) {
		st.record(&contract.Event{TaskID: task, Account: "acct-" + task, Kind: contract.EventSent, At: now})
		now = now.Add(time.Second)
	}
	charted := func(id string) bool {
		_, ok := st.view(id, false, 10)
		return ok
	}
	send("running-old")
	send("ended-old")
	send("ended-new")
	send("running-new")
	st.ended("ended-old")
	st.ended("ended-new")
	send("t5") // evicts ended-old: ended, idle longest
	require.False(t, charted("ended-old"))
	send("t6") // evicts ended-new
	require.False(t, charted("ended-new"))
	send("t7") // every series is in use: t7 is not charted
	require.False(t, charted("t7"))
	for _, id := range []string{"running-old", "running-new", "t5", "t6"} {
		require.True(t, charted(id), id)
	}
	now = now.Add(evictAfter)
	send("t8") // all idle for evictAfter: the idle longest, running-old, goes
	require.False(t, charted("running-old"))
	require.True(t, charted("t8"))
	for i := range 1000 {
		send(fmt.Sprintf("many-%d", i))
	}
	tasks, accounts := st.size()
	require.Equal(t, 4, tasks)
	require.Equal(t, 4, accounts, "accounts are bounded the same way")
	require.Equal(t, uintptr(bucketBytes), unsafe.Sizeof(seriesBucket{}))
	require.Less(t, unsafe.Sizeof(series{}), uintptr(262_200), "the bound docs/dashboard.md states: 262 KB a series")
}

// TestSeriesOfDeletedAccountsAreDropped: a deleted account's series goes
// with it; the other accounts' and the tasks' stay.
func TestSeriesOfDeletedAccountsAreDropped(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := seriesAt(8, &now)
	for _, a := range []string{"kept", "deleted"} {
		st.record(&contract.Event{TaskID: "t-" + a, Account: a, Kind: contract.EventSent, At: now})
	}
	st.dropAccounts(func(name string) bool { return name == "kept" })
	_, ok := st.view("kept", true, 10)
	require.True(t, ok)
	_, ok = st.view("deleted", true, 10)
	require.False(t, ok, "the deleted account's series is dropped")
	tasks, accounts := st.size()
	require.Equal(t, 2, tasks, "task series stay")
	require.Equal(t, 1, accounts)
}

// BenchmarkSeriesRecord is the cost the charts add to folding one event.
func BenchmarkSeriesRecord(b *testing.B) {
	st := newSeriesStore(64)
	now := time.Now()
	ev := &contract.Event{TaskID: "t1", Account: "a1", Kind: contract.EventSent, Index: 1, At: now}
	b.ReportAllocs()
	for range b.N {
		st.record(ev)
	}
}

// TestSeriesConcurrentUse: the fold records, the sampler samples and the
// API reads at once (run with -race); every event is counted once.
func TestSeriesConcurrentUse(t *testing.T) {
	t.Parallel()
	st := newSeriesStore(8)
	const writers, each = 4, 2000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 500 {
			st.sampleAccount("a1", accountSample{rate: 10, ceiling: 20, queue: 3})
			st.view("t1", false, 60)
			st.view("a1", true, 60)
		}
	}()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				st.record(&contract.Event{TaskID: "t1", Account: "a1", Kind: contract.EventSent, Index: w*each + i, At: time.Now()})
			}
		})
	}
	wg.Wait()
	<-done
	v, ok := st.view("t1", false, 3600)
	require.True(t, ok)
	var sum uint32
	for _, n := range v.PerMinute.Sent {
		sum += n
	}
	require.Equal(t, uint32(writers*each), sum)
}
