// Package feedback closes the loop with the providers: it accepts their
// delivery receipts on webhook routes, polls WxPusher for the statuses it
// does not post, and turns them into events.
//
// Serves (HTTP on Config.Addr, FEEDBACK_ADDR, default 127.0.0.1:8090):
//   - GET /webhooks/whatsapp: Meta's subscription handshake; hub.mode
//     subscribe and a hub.verify_token equal to the token of a WhatsApp
//     account (the variable its verify_token_env names) get hub.challenge
//     back, anything else 403.
//   - POST /webhooks/whatsapp: Meta's payload (entry[].changes[].value
//     .statuses[]), signed in X-Hub-Signature-256 with the app secret (the
//     variable app_secret_env names), checked in constant time on the raw
//     body before anything in it is read; value.metadata.phone_number_id
//     selects the account. Statuses delivered, read and failed (with
//     errors[0]'s code, title, message and error_data.details) are kept;
//     sent and unknown statuses and other webhook fields are ignored.
//   - POST /webhooks/receipts: the webhook channel's receipt
//     {"id","status","code","error","at"}, id being the Idempotency-Key of
//     the send, for the account in X-Broadcast-Account, signed in
//     X-Broadcast-Signature with the account's secret_env (the secret
//     dispatch signs its requests to the gateway with).
//   - POST /webhooks/bounce: {"email","type":"hard"|"soft"|"complaint",
//     "reason"}, with "Authorization: Bearer <FEEDBACK_TOKEN>".
//
// More than Config.MaxInFlight (256) requests at once get 503 at once.
// Unsigned, wrongly signed or unauthorized posts get 401 (a handshake with
// the wrong token 403), bodies above Config.MaxBody (1 MiB) 413, invalid
// ones 400 naming the field; each is counted in
// broadcast_feedback_refused_total{route,reason}. An accepted receipt is
// answered 200 only after the server acknowledged storing it in stream
// RECEIPTS (broadcast.receipts.<source>.<account>), so a crash of
// feedback loses none: the provider retries whatever got no 200.
//
// Consumes:
//   - EVENTS, sent events only (broadcast.events.*.sent), with the durable
//     consumer "feedback-index": each sent event's provider id (and, for
//     webhook accounts, its job id; for SMTP accounts, its recipient) is
//     written, hashed, into KV broadcast_provider_ids (TTL 8 days) with
//     its task, recipient index, account and attempt.
//   - RECEIPTS with the durable consumer "feedback": each receipt is
//     looked up in that index. A receipt that raced ahead of its sent
//     event is tried again with a growing delay for Config.MatchWait (and
//     while the index consumer still has sent events to read), then
//     counted unmatched (broadcast_feedback_receipts_total) and logged.
//     Bounces are matched by the address to the most recent SMTP send to
//     it.
//   - EVENTS, sent events only, with the durable consumer
//     "feedback-wxpusher": the WxPusher poller. A send of a wxpusher
//     account is kept unacknowledged (NakWithDelay) and its sendRecordId
//     queried, GET {endpoint}/api/send/query/status?sendRecordId=&appToken=
//     (the appToken from the variable the account's secret_env names),
//     Config.WxPusherFirstPoll (30 s) after the send, then each time the
//     send's age has doubled, at most Config.WxPusherMaxPollDelay (30 min)
//     apart, until a final status or Config.WxPusherPollFor (7 days).
//     Queries are paced per app (appToken) at Config.WxPusherRate
//     (FEEDBACK_WXPUSHER_RATE, 1/s), burst one; Config.WxPusherMaxPending
//     (10,000) bounds the sends waiting at once. A final status is stored
//     in RECEIPTS (broadcast.receipts.wxpusher.<account>, id the
//     sendRecordId, status delivered or failed with WxPusher's status and
//     description) and handled like any receipt.
//
// A digest's message (services/dispatch, digest.go) carries several tasks'
// recipients under one provider id: the carrier's sent event is indexed
// under the id with its digest_size, the items' beside it (key plus
// ".<hash of the item's job id>"), and a receipt for the message becomes
// an event for each of them (retried until all are indexed).
//
// Publishes: broadcast.events.<task>.delivered, .read and .undelivered
// (contract.Event with the sent event's job, index, account and attempt,
// the provider's code and reason, the provider id; Nats-Msg-Id
// <job>:<kind>:<attempt>, so a duplicated receipt is one event). A
// complaint is delivered with code "complaint" (it arrived, unwanted); a
// hard bounce is undelivered with code "hard_bounce"; a soft bounce makes
// no event. status folds the events into progress (services/status).
//
// Writes KV broadcast_suppressions (suppress.go, through
// internal/suppress's Merge, which never weakens an entry): WhatsApp
// 131050 adds a marketing opt-out (scope whatsapp, reason opt_out,
// categories ["marketing"]); 131049 a marketing hold (reason
// frequency_cap, until 24 h after the provider's time), so marketing
// tasks skip the recipient with code suppressed meanwhile; an email hard
// bounce reason bounce and a complaint reason complaint, every category
// (scope smtp). 131026 adds nothing: it is undelivered, never re-sent.
// Failed WhatsApp statuses keep their recipient_id on the stored receipt
// for this (Receipt.To). Inbound WhatsApp text messages (value.messages)
// whose body, trimmed and in any case, is a stop keyword (Config.
// StopKeywords, FEEDBACK_STOP_KEYWORDS; default STOP, UNSUBSCRIBE, 退订,
// TD) add their sender (scope whatsapp, reason opt_out, source whatsapp,
// every category) before the post is answered (stop.go), only for phone
// numbers of accounts whose app secret signed it.
//
// Writes KV broadcast_signals (quality.go): WhatsApp's account webhook
// phone_number_quality_update, matched to the account whose
// display_phone_number has the same digits and signed with its app
// secret, sets the account's quality (FLAGGED RED, UNFLAGGED GREEN, a
// relayed quality_rating as given) and messaging limit (the portfolio's
// max_daily_conversations_per_business, else current_limit), by
// compare-and-set, before the post is answered; an update older than the
// stored one changes nothing.
//
// Where to edit what: service.go (starting and stopping the parts, each
// start step and consumer tried again while the server restarts:
// shared.SetUp),
// http.go (the server, body limit, storing before answering), whatsapp.go
// (Meta's handshake, signature and payload), receipts.go (the webhook
// channel's receipts), bounce.go (email bounces and the bearer token),
// accounts.go (which account a post is for, and its secrets from the
// environment), receipt.go (the stored receipt, index keys and values),
// index.go (indexing sent events), process.go (receipts to events,
// unmatched receipts), suppress.go (receipts to suppression entries),
// quality.go (quality and messaging-limit updates to KV broadcast_signals),
// stop.go (stop keyword replies to opt-outs), wxpusher.go (the WxPusher
// poller: its consumer, pacing, status answers and the API shape
// assumed), config.go (settings).
package feedback
