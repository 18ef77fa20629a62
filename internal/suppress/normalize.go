// Package suppress reads and writes the suppression list (KV
// broadcast_suppressions) and keeps the in-memory view render and
// dispatch check every recipient against.
//
// Files: normalize.go (the recipient's canonical form per scope),
// list.go (add, remove, get and list entries; the CLI and feedback write
// through it), view.go (the view of hashes, loaded as a pulled snapshot
// and kept current by a watch, and its Lookup).
package suppress

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

// registry normalizes recipients the way each channel does.
var registry = channels.Builtin()

// Normalize returns to in the canonical form its key is hashed from. For a
// channel scope it is the channel's own normalization (E.164 for
// WhatsApp, trimmed for webhook), so an entry matches what render sends;
// for SMTP the whole address is lower-cased (the channel keeps the local
// part's case for sending, but providers report bounces lower-cased and
// treat the local part as case-insensitive, so "Ann@x.org" and
// "ann@x.org" are one entry). For scope "all" it is normalizeAll. An
// unknown channel is an error naming the scope.
func Normalize(scope, to string) (string, error) {
	if scope == contract.ScopeAll {
		n := normalizeAll(to)
		if n == "" {
			return "", fmt.Errorf("to: must not be empty")
		}
		if len(n) > contract.MaxRecipientBytes {
			return "", fmt.Errorf("to: is %d bytes, limit is %d", len(n), contract.MaxRecipientBytes)
		}
		return n, nil
	}
	ch, err := registry.Get(scope)
	if err != nil {
		return "", fmt.Errorf("scope: %q is neither %q nor a channel (%s)", scope, contract.ScopeAll, strings.Join(registry.Names(), ", "))
	}
	n, err := ch.NormalizeRecipient(to)
	if err != nil {
		return "", fmt.Errorf("to: %w", err)
	}
	return keyForm(scope, n), nil
}

// keyForm turns a recipient already normalized by channel into the form
// its channel-scope key is hashed from: SMTP addresses lower-cased whole.
func keyForm(channel, normalized string) string {
	if channel == smtpChannel {
		return strings.ToLower(normalized)
	}
	return normalized
}

// smtpChannel is the SMTP channel's name.
var smtpChannel = channels.SMTP{}.Name()

// normalizeAll is the channel-independent form used for scope "all": an
// email address as SMTP normalizes it, lower-cased whole, a phone number starting with "+"
// in E.164, anything else trimmed. A "+" followed by digits only is taken
// as E.164 already, so render's check of a WhatsApp or SMS recipient
// (E.164 by then) costs no parse.
func normalizeAll(to string) string {
	to = strings.TrimSpace(to)
	switch {
	case strings.Contains(to, "@"):
		if n, err := (channels.SMTP{}).NormalizeRecipient(to); err == nil {
			return strings.ToLower(n)
		}
	case strings.HasPrefix(to, "+") && !digitsOnly(to[1:]):
		if n, err := channels.NormalizeE164(to, ""); err == nil {
			return n
		}
	}
	return to
}

func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }
