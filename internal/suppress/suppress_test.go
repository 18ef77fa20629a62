package suppress_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/suppress"
	"github.com/broadcastd/broadcast/internal/topologytest"
)

func TestNormalize(t *testing.T) {
	t.Parallel()
	cases := []struct{ scope, in, want, err string }{
		{"whatsapp", " +86 138 0000 0001 ", "+8613800000001", ""},
		{"smtp", "Ann.Lee@Example.COM", "ann.lee@example.com", ""},
		{"webhook", "  user-7 ", "user-7", ""},
		{"all", "+86 138-0000-0001", "+8613800000001", ""},
		{"all", "A@B.Org", "a@b.org", ""},
		{"all", "uid_x", "uid_x", ""},
		{"all", "  ", "", "to: must not be empty"},
		{"whatsapp", "13800000001", "", "to: "},
		{"fax", "x", "", `scope: "fax" is neither`},
	}
	for _, c := range cases {
		got, err := suppress.Normalize(c.scope, c.in)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}

func TestKeyIsScopeAndHexSHA256(t *testing.T) {
	t.Parallel()
	e := contract.Suppression{To: "+86 138 0000 0001", Reason: contract.ReasonOptOut}
	key, err := suppress.Prepare("whatsapp", &e)
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("+8613800000001"))
	require.Equal(t, "whatsapp."+hex.EncodeToString(sum[:]), key)
	require.Len(t, key, len("whatsapp.")+64)
	require.Equal(t, "+8613800000001", e.To)
	require.False(t, e.At.IsZero())
	data, err := json.Marshal(e)
	require.NoError(t, err)
	require.Contains(t, string(data), `"categories":[]`, "empty, not null: every category")

	_, err = suppress.Prepare("all", &contract.Suppression{To: "x", Reason: ""})
	require.ErrorContains(t, err, "reason: required")
	_, err = suppress.Prepare("all", &contract.Suppression{To: "x", Reason: "manual", Categories: []contract.Category{"promo"}})
	require.ErrorContains(t, err, "categories[0]: must be marketing")
	_, err = suppress.Prepare("a.b", &contract.Suppression{To: "x", Reason: "manual"})
	require.ErrorContains(t, err, "scope:")
}

func entry(t testing.TB, to, reason string, until *time.Time, cats ...contract.Category) []byte {
	data, err := json.Marshal(contract.Suppression{To: to, Reason: reason, Source: "test", At: time.Now(), Categories: cats, Until: until})
	require.NoError(t, err)
	return data
}

func TestViewCategoriesScopesAndUntil(t *testing.T) {
	t.Parallel()
	v := suppress.NewView()
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	require.NoError(t, v.Apply(contract.SuppressionKey("whatsapp", "+8613800000001"), true, entry(t, "+8613800000001", "opt_out", nil, contract.CategoryMarketing)))
	require.NoError(t, v.Apply(contract.SuppressionKey("all", "a@b.org"), true, entry(t, "a@b.org", "complaint", nil)))
	require.NoError(t, v.Apply(contract.SuppressionKey("whatsapp", "+8613800000002"), true, entry(t, "+8613800000002", "frequency_cap", &future, contract.CategoryMarketing)))
	require.NoError(t, v.Apply(contract.SuppressionKey("whatsapp", "+8613800000003"), true, entry(t, "+8613800000003", "frequency_cap", &past)))
	require.Error(t, v.Apply("whatsapp.nothex", true, entry(t, "x", "manual", nil)))
	require.Error(t, v.Apply(contract.SuppressionKey("whatsapp", "+1"), true, []byte("{")))
	require.Equal(t, 4, v.Len())

	hit, ok := v.Lookup("whatsapp", "+8613800000001", contract.CategoryMarketing)
	require.True(t, ok)
	require.Equal(t, suppress.Hit{Scope: "whatsapp", Reason: "opt_out"}, hit)
	require.NotContains(t, hit.Explain(), "+86")
	_, ok = v.Lookup("whatsapp", "+8613800000001", contract.CategoryTransactional)
	require.False(t, ok, "a marketing opt-out lets transactional through")
	_, ok = v.Lookup("whatsapp", "+8613800000001", "")
	require.True(t, ok, "no category reads as marketing")
	_, ok = v.Lookup("sms", "+8613800000001", contract.CategoryMarketing)
	require.False(t, ok, "a channel entry is for that channel only")

	for _, ch := range []string{"smtp", "webhook"} {
		hit, ok = v.Lookup(ch, "a@b.org", contract.CategoryTransactional)
		require.True(t, ok, ch)
		require.Equal(t, "all", hit.Scope)
	}
	_, ok = v.Lookup("webhook", " A@B.ORG", contract.CategoryUtility)
	require.True(t, ok, "a webhook recipient is normalized for scope all")
	_, ok = v.Lookup("smtp", "A@b.org", contract.CategoryUtility)
	require.True(t, ok, "an address matches whatever its case")

	_, ok = v.Lookup("whatsapp", "+8613800000002", contract.CategoryMarketing)
	require.True(t, ok, "a hold before its until")
	_, ok = v.Lookup("whatsapp", "+8613800000003", contract.CategoryMarketing)
	require.False(t, ok, "a hold past its until")

	require.NoError(t, v.Apply(contract.SuppressionKey("whatsapp", "+8613800000001"), false, nil))
	_, ok = v.Lookup("whatsapp", "+8613800000001", contract.CategoryMarketing)
	require.False(t, ok, "removed")
	require.Equal(t, 3, v.Len())

	var nilView *suppress.View
	_, ok = nilView.Lookup("whatsapp", "+1", contract.CategoryMarketing)
	require.False(t, ok)
}

func setup(t *testing.T) (*natstest.Server, *suppress.List) {
	ts := topologytest.Start(t)
	l, err := suppress.Open(t.Context(), ts.JS)
	require.NoError(t, err)
	return ts, l
}

func TestListAndViewThroughKV(t *testing.T) {
	t.Parallel()
	ts, l := setup(t)
	ctx := t.Context()
	_, err := l.Put(ctx, "smtp", contract.Suppression{To: "Old@X.org", Reason: "manual", Source: "test"})
	require.NoError(t, err)
	v, err := suppress.Watch(ctx, ts.JS, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, ok := v.Lookup("smtp", "Old@x.org", contract.CategoryMarketing)
	require.True(t, ok, "loaded at start")

	_, err = l.Put(ctx, "whatsapp", contract.Suppression{To: "+8613800000001", Reason: "opt_out", Categories: []contract.Category{"marketing"}})
	require.NoError(t, err)
	natstest.Eventually(t, 5*time.Second, func() bool {
		_, ok := v.Lookup("whatsapp", "+8613800000001", contract.CategoryMarketing)
		return ok
	}, "a live add reaches the view")

	_, err = l.Remove(ctx, "whatsapp", "+86 138 0000 0001")
	require.NoError(t, err)
	natstest.Eventually(t, 5*time.Second, func() bool {
		_, ok := v.Lookup("whatsapp", "+8613800000001", contract.CategoryMarketing)
		return !ok
	}, "a removal reaches the view")

	var got []suppress.Stored
	require.NoError(t, l.All(ctx, func(s suppress.Stored) error { got = append(got, s); return nil }))
	require.Len(t, got, 1)
	require.Equal(t, "smtp", got[0].Scope)
	require.Equal(t, "old@x.org", got[0].To)
}

func TestMergeNeverWeakens(t *testing.T) {
	t.Parallel()
	_, l := setup(t)
	ctx := t.Context()
	get := func(key string) contract.Suppression {
		var out contract.Suppression
		require.NoError(t, l.All(ctx, func(s suppress.Stored) error {
			if s.Key == key {
				out = s.Suppression
			}
			return nil
		}))
		return out
	}
	h1, h2 := time.Now().Add(time.Hour).UTC().Truncate(time.Second), time.Now().Add(2*time.Hour).UTC().Truncate(time.Second)
	mk := contract.CategoryMarketing
	key, err := l.Merge(ctx, "whatsapp", contract.Suppression{To: "+1 650 555 0100", Reason: "frequency_cap", Until: &h2, Categories: []contract.Category{mk}})
	require.NoError(t, err)
	_, err = l.Merge(ctx, "whatsapp", contract.Suppression{To: "+16505550100", Reason: "frequency_cap", Until: &h1, Categories: []contract.Category{mk}})
	require.NoError(t, err)
	require.Equal(t, h2, *get(key).Until, "an earlier hold does not shorten a later one")

	_, err = l.Merge(ctx, "whatsapp", contract.Suppression{To: "+16505550100", Reason: "opt_out", Categories: []contract.Category{mk}})
	require.NoError(t, err)
	require.Nil(t, get(key).Until, "an opt-out replaces a hold")
	_, err = l.Merge(ctx, "whatsapp", contract.Suppression{To: "+16505550100", Reason: "frequency_cap", Until: &h1, Categories: []contract.Category{mk}})
	require.NoError(t, err)
	require.Nil(t, get(key).Until, "a hold never replaces an opt-out")
	require.Equal(t, "opt_out", get(key).Reason)
	_, err = l.Merge(ctx, "whatsapp", contract.Suppression{To: "+16505550100", Reason: "opt_out", Categories: []contract.Category{contract.CategoryUtility}})
	require.NoError(t, err)
	require.ElementsMatch(t, []contract.Category{mk, contract.CategoryUtility}, get(key).Categories)
}

// BenchmarkLookup is render's and dispatch's per-recipient cost with a
// 1M-entry list: a miss (the common case) and a hit.
func BenchmarkLookup(b *testing.B) {
	const n = 1_000_000
	v := fill(b, n)
	misses, hits := make([]string, n), make([]string, n)
	for i := range n {
		misses[i], hits[i] = fmt.Sprintf("+86139%08d", i), fmt.Sprintf("+86138%08d", i)
	}
	b.Run("miss", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, ok := v.Lookup("whatsapp", misses[i%n], contract.CategoryMarketing); ok {
				b.Fatal("hit")
			}
		}
	})
	b.Run("hit", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			if _, ok := v.Lookup("whatsapp", hits[i%n], contract.CategoryMarketing); !ok {
				b.Fatal("miss")
			}
		}
	})
}

// BenchmarkViewMemory reports the heap the view holds per entry.
func BenchmarkViewMemory(b *testing.B) {
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		v := fill(b, 1_000_000)
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(v.Len()), "B/entry")
		runtime.KeepAlive(v)
	}
}

func fill(b testing.TB, n int) *suppress.View {
	v := suppress.NewView()
	value := entry(b, "x", "opt_out", nil, contract.CategoryMarketing)
	for i := range n {
		to := "+86138" + fmt.Sprintf("%08d", i)
		if err := v.Apply(contract.SuppressionKey("whatsapp", to), true, value); err != nil {
			b.Fatal(err)
		}
	}
	return v
}

// BenchmarkApply is the cost of one entry as a view loads the list.
func BenchmarkApply(b *testing.B) {
	v := suppress.NewView()
	value := entry(b, "+8613800000001", "opt_out", nil, contract.CategoryMarketing)
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = contract.SuppressionKey("whatsapp", fmt.Sprintf("+86138%08d", i))
	}
	for i := 0; b.Loop(); i++ {
		if err := v.Apply(keys[i%len(keys)], true, value); err != nil {
			b.Fatal(err)
		}
	}
}
