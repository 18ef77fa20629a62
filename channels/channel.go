// Package channels holds the adapters that deliver messages to providers:
// webhook (any HTTP gateway), sandbox (simulated, in process), and the real
// provider channels. Render uses a channel to validate and normalise
// recipients and bodies; dispatch uses it to send.
//
// Where to edit what:
//   - channel.go: the Channel / Sender interfaces and Result.
//   - registry.go: which channels exist.
//   - webhook.go, sandbox.go, whatsapp.go, wxpusher.go, smtp.go: one file
//     per adapter, holding only its provider's protocol; smtp.go's
//     transactions are in smtp_pipeline.go (serial, and PIPELINING),
//     smtp_chunking.go (BDAT) and smtp_shared.go (fewer connections than
//     concurrency).
//   - adapter.go: what every adapter shares: reading the account
//     (options, secret_env, endpoint, timeout), the one HTTP client (no
//     redirects, proxy from the environment, NetPolicy's address checks)
//     and Result.Err's text (clipped, secrets and URL queries redacted).
//   - limits.go: an account's effective max_batch and daily cap.
//   - gate.go: the send gate a Send's caller passes (WithSendGate), asked
//     again once a connection is ready, before the message is written
//     (smtp.go and smtp_shared.go ask it; the HTTP adapters, whose
//     connections are kept alive, do not).
//   - httpclass.go: mapping HTTP answers and Retry-After onto error classes.
//   - *_test.go: the tests of the file of the same name;
//     retryafter_fuzz_test.go fuzzes httpclass.go's ParseRetryAfter.
package channels

import (
	"context"
	"time"

	"github.com/broadcastd/broadcast/contract"
)

// Message is one recipient's send as an adapter sees it.
type Message struct {
	// ID is the job id: the idempotency key, identical for every attempt at
	// this task and recipient.
	ID      string
	TaskID  string
	To      string
	Body    string
	Account string
	Attempt int
	// Vars are the recipient's merged variables (for provider-side templates).
	Vars map[string]any
}

// Result is the outcome of one message. The zero Class means sent.
type Result struct {
	// Class is empty when the provider accepted the message.
	Class contract.ErrorClass
	// Code is the provider's answer: an HTTP status or a provider error code.
	Code string
	// Err describes the failure for people; never contains secrets.
	Err string
	// RetryAfter is the provider's requested wait, when it gave one.
	RetryAfter time.Duration
	// ProviderID is the provider's message id, when it gives one.
	ProviderID string
}

// OK reports whether the message was accepted.
func (r Result) OK() bool { return r.Class == "" }

// Channel is one kind of provider.
type Channel interface {
	// Name is the value of "channel" in tasks and accounts.
	Name() string
	// NormalizeRecipient validates to for this channel and returns its
	// canonical form, used both for sending and for duplicate detection.
	NormalizeRecipient(to string) (string, error)
	// CheckBody validates a rendered body against the channel's limits.
	CheckBody(body string) error
	// NewSender builds a sender for one account. getenv resolves the
	// account's secret_env. It is called again whenever the account changes.
	NewSender(acct *contract.Account, getenv func(string) string) (Sender, error)
}

// Sender delivers messages through one account.
type Sender interface {
	// Send delivers msgs, all with the same Body, at most the account's
	// max_batch of them, and returns one Result per message in order.
	Send(ctx context.Context, msgs []Message) []Result
}

// HTMLChannel is a Channel some of whose accounts send the body as HTML
// (smtp with "html":true, wxpusher with content_type 2). Render escapes the
// recipient's variables for those accounts (contract.Template.RenderEscaped),
// so a variable cannot inject markup, links or scripts into the message;
// the template's own text is the task author's HTML.
type HTMLChannel interface {
	Channel
	// HTMLBody reports whether acct sends bodies as HTML.
	HTMLBody(acct *contract.Account) bool
}

// BatchChannel is a Channel whose provider takes several recipients with
// identical content in one call (WxPusher: 2,000 uids). Only for these does
// dispatch merge recipients into one Send.
type BatchChannel interface {
	Channel
	// MaxBatch is the most recipients one provider call may carry.
	MaxBatch() int
}

// Fail builds a failed Result for every message, for errors that hit a
// whole call.
func Fail(n int, r Result) []Result {
	out := make([]Result, n)
	for i := range out {
		out[i] = r
	}
	return out
}
