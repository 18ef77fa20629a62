package feedback

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseWhatsAppStops: only text messages equal to a keyword, trimmed
// and in any case, count; a keyword reply without phone_number_id or
// sender is refused naming the field.
func TestParseWhatsAppStops(t *testing.T) {
	t.Parallel()
	body := []byte(`{"object":"whatsapp_business_account","entry":[{"changes":[{"field":"messages","value":{"metadata":{"phone_number_id":"p1"},"messages":[
		{"from":"8613800000001","type":"text","text":{"body":"  Stop\n"}},
		{"from":"8613800000002","type":"text","text":{"body":"退订"}},
		{"from":"8613800000003","type":"text","text":{"body":"stop please"}},
		{"from":"8613800000004","type":"image","text":{"body":"STOP"}},
		{"from":"+8613800000005","type":"text","text":{"body":"unsubscribe"}}]}}]}]}`)
	got, err := parseWhatsAppStops(body, DefaultStopKeywords)
	require.NoError(t, err)
	require.Equal(t, []whatsappStop{{"p1", "+8613800000001"}, {"p1", "+8613800000002"}, {"p1", "+8613800000005"}}, got)
	got, err = parseWhatsAppStops(body, []string{"QUIT"})
	require.NoError(t, err)
	require.Empty(t, got)

	_, err = parseWhatsAppStops([]byte(`{"entry":[{"changes":[{"value":{"messages":[{"from":"1","type":"text","text":{"body":"stop"}}]}}]}]}`), DefaultStopKeywords)
	require.EqualError(t, err, "entry[0].changes[0].value.metadata.phone_number_id: required with messages")
	_, err = parseWhatsAppStops([]byte(`{"entry":[{"changes":[{"value":{"metadata":{"phone_number_id":"p"},"messages":[{"type":"text","text":{"body":"TD"}}]}}]}]}`), DefaultStopKeywords)
	require.EqualError(t, err, "entry[0].changes[0].value.messages[0].from: required, at most 32 digits")
}

// TestStopKeywordsFromEnv: FEEDBACK_STOP_KEYWORDS replaces the default
// list, "none" turns it off, unset keeps the default.
func TestStopKeywordsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want []string
	}{
		{"", DefaultStopKeywords},
		{" QUIT , 取消,, ", []string{"QUIT", "取消"}},
		{"none", nil},
	} {
		t.Setenv("FEEDBACK_STOP_KEYWORDS", tc.env)
		c, err := ConfigFromEnv()
		require.NoError(t, err)
		c.withDefaults()
		require.Equal(t, tc.want, c.StopKeywords, tc.env)
	}
}
