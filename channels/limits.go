package channels

import "github.com/broadcastd/broadcast/contract"

// An account's limits as its channel makes them: how many recipients one
// call carries and how many distinct recipients a rolling day allows.
// Dispatch sends and caps by these rather than by the raw fields.

// EffectiveMaxBatch is how many messages one Send to acct may carry: the
// account's max_batch within the channel's limit, or 1 for a channel that
// is not a BatchChannel (its Send would only loop over single sends, which
// the account's rate, counted per call for batch accounts, would no longer
// pace).
func EffectiveMaxBatch(ch Channel, acct *contract.Account) int {
	bc, ok := ch.(BatchChannel)
	if !ok || acct.MaxBatch <= 1 {
		return 1
	}
	return min(acct.MaxBatch, bc.MaxBatch())
}

// EffectiveDailyCap is the account's daily_cap, or for a WhatsApp account
// whose daily_cap is 0 the cap of its tier. It returns 0 (no cap) when
// neither is set or the tier is invalid (NewSender reports that).
func EffectiveDailyCap(acct *contract.Account) int {
	if acct.DailyCap > 0 {
		return acct.DailyCap
	}
	return TierDailyCap(acct)
}

// TierDailyCap is the cap of a WhatsApp account's configured tier, 0 when
// it has none (or is not a WhatsApp account).
func TierDailyCap(acct *contract.Account) int {
	if acct.Channel != (WhatsApp{}).Name() {
		return 0
	}
	var o whatsappOptions
	if decodeOptions(acct, &o) != nil || o.Tier == "" {
		return 0
	}
	c, err := WhatsAppTierCap(o.Tier)
	if err != nil {
		return 0
	}
	return c
}
