package feedback

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

func TestSuppressionFromReceipts(t *testing.T) {
	t.Parallel()
	recv := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	wa := func(code string) *Receipt {
		return &Receipt{Source: SourceWhatsApp, Status: StatusFailed, Code: code, To: "+8613800000001", At: recv.Add(-time.Minute), Received: recv}
	}
	scope, e, ok := suppression(wa("131050"))
	require.True(t, ok)
	require.Equal(t, "whatsapp", scope)
	require.Equal(t, contract.ReasonOptOut, e.Reason)
	require.Equal(t, []contract.Category{contract.CategoryMarketing}, e.Categories)
	require.Nil(t, e.Until)

	scope, e, ok = suppression(wa("131049"))
	require.True(t, ok)
	require.Equal(t, "whatsapp", scope)
	require.Equal(t, contract.ReasonFrequencyCap, e.Reason)
	require.Equal(t, recv.Add(-time.Minute).Add(24*time.Hour), *e.Until, "24 h from the provider's time")
	require.Equal(t, []contract.Category{contract.CategoryMarketing}, e.Categories)

	future := wa("131049")
	future.At = recv.Add(time.Hour)
	_, e, _ = suppression(future)
	require.Equal(t, recv.Add(24*time.Hour), *e.Until, "a provider clock ahead of ours is not trusted")

	for _, code := range []string{"131026", "131047", ""} {
		_, _, ok = suppression(wa(code))
		require.False(t, ok, code)
	}
	noTo := wa("131050")
	noTo.To = ""
	_, _, ok = suppression(noTo)
	require.False(t, ok, "no recipient_id")

	scope, e, ok = suppression(&Receipt{Source: SourceBounce, Status: BounceHard, Email: "a@b.org"})
	require.True(t, ok)
	require.Equal(t, "smtp", scope)
	require.Equal(t, contract.ReasonBounce, e.Reason)
	require.Empty(t, e.Categories, "every category")
	_, e, ok = suppression(&Receipt{Source: SourceBounce, Status: BounceComplaint, Email: "a@b.org"})
	require.True(t, ok)
	require.Equal(t, contract.ReasonComplaint, e.Reason)
	_, _, ok = suppression(&Receipt{Source: SourceBounce, Status: BounceSoft, Email: "a@b.org"})
	require.False(t, ok, "a soft bounce is transient")
}

func TestWhatsAppReceiptKeepsRecipient(t *testing.T) {
	t.Parallel()
	body := []byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"1"},` +
		`"statuses":[{"id":"wamid.x","status":"failed","recipient_id":"8613800000001","errors":[{"code":131050}]}]}}]}]}`)
	out, _, err := parseWhatsApp(body, time.Now())
	require.NoError(t, err)
	require.Len(t, out, 1)
	require.Equal(t, "+8613800000001", out[0].To)
	require.Equal(t, "131050", out[0].Code)
}
