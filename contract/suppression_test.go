package contract

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSuppressionCovers(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	before, after := now.Add(-time.Second), now.Add(time.Second)
	for _, c := range []struct {
		s    Suppression
		cat  Category
		want bool
	}{
		{Suppression{}, CategoryTransactional, true},
		{Suppression{Categories: []Category{CategoryMarketing}}, CategoryMarketing, true},
		{Suppression{Categories: []Category{CategoryMarketing}}, CategoryUtility, false},
		{Suppression{Until: &after}, CategoryMarketing, true},
		{Suppression{Until: &now}, CategoryMarketing, false},
		{Suppression{Until: &before}, CategoryMarketing, false},
	} {
		require.Equal(t, c.want, c.s.Covers(c.cat, now), "%+v %s", c.s, c.cat)
	}
	require.Len(t, SuppressionKey("all", "x"), len("all.")+64)
}
