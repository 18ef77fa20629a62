package permissions

import (
	"fmt"
	"strings"
)

// NSC returns the nsc commands that create every user with the same
// permissions in an nsc account (decentralized authentication, where each
// service connects with NATS_CREDS): one `nsc add user` per user, one
// flag per grant group.
func NSC() []byte {
	var b strings.Builder
	b.WriteString(`# Broadcast's users for decentralized authentication, generated from the
# table in internal/permissions (go run ./cmd/broadcast authconf -nsc).
# Run them with the account selected (nsc env -a <account>), push the account
# to the servers, then hand each process its credentials:
#   nsc generate creds -n ingest > ingest.creds   # NATS_CREDS=/etc/broadcast/ingest.creds
`)
	for _, u := range Users() {
		b.WriteString("\n")
		writeComment(&b, "", u.About)
		fmt.Fprintf(&b, "nsc add user --name %s", u.Name)
		flags := func(flag string, grants []Grant) {
			for _, g := range grants {
				fmt.Fprintf(&b, " \\\n  %s '%s'", flag, strings.Join(g.Subjects, ","))
			}
		}
		flags("--allow-pub", u.Publish.Allow)
		flags("--deny-pub", u.Publish.Deny)
		flags("--allow-sub", u.Subscribe.Allow)
		flags("--deny-sub", u.Subscribe.Deny)
		if u.AllowResponses {
			b.WriteString(" \\\n  --allow-pub-response")
		}
		b.WriteString("\n")
	}
	return []byte(b.String())
}
