package feedback

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/feedbacktest"
)

func TestParseQualityUpdates(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	body := feedbacktest.WhatsAppQualityPayload(
		feedbacktest.WhatsAppQualityUpdate{DisplayPhoneNumber: "15550783881", Event: "FLAGGED", CurrentLimit: "TIER_10K", At: at},
		feedbacktest.WhatsAppQualityUpdate{DisplayPhoneNumber: "+1 555 078 3882", Event: "UPGRADE", CurrentLimit: "TIER_1K", MaxDailyPerBusiness: "TIER_UNLIMITED", At: at},
		feedbacktest.WhatsAppQualityUpdate{DisplayPhoneNumber: "15550783883", Event: "ONBOARDING", CurrentLimit: "TIER_NOT_SET", At: at})
	got, err := parseQualityUpdates(body, at.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, []qualityUpdate{
		{DisplayPhone: "15550783881", Quality: contract.QualityRed, Limit: 10000, Tier: "TIER_10K", Event: "FLAGGED", At: at},
		{DisplayPhone: "15550783882", Limit: contract.MessagingLimitUnlimited, Tier: "TIER_UNLIMITED", Event: "UPGRADE", At: at},
		{DisplayPhone: "15550783883", Event: "ONBOARDING", At: at},
	}, got)

	// A relayed payload's quality_rating wins over the event.
	relayed := []byte(`{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"phone_number_quality_update",
		"value":{"display_phone_number":"15550783881","event":"UNFLAGGED","quality_rating":"YELLOW"}}]}]}`)
	got, err = parseQualityUpdates(relayed, at)
	require.NoError(t, err)
	require.Equal(t, contract.QualityYellow, got[0].Quality)

	bad := []byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"phone_number_quality_update","value":{"event":"FLAGGED"}}]}]}`)
	_, err = parseQualityUpdates(bad, at)
	require.ErrorContains(t, err, "entry[0].changes[0].value.display_phone_number")
	statuses := feedbacktest.WhatsAppPayload("1", feedbacktest.WhatsAppStatus{ID: "wamid.1", Status: "delivered"})
	got, err = parseQualityUpdates(statuses, at)
	require.NoError(t, err)
	require.Empty(t, got, "statuses are not quality updates")
}
