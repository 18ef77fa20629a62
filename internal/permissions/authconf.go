package permissions

import (
	"fmt"
	"strings"
)

// Regenerate is the command that writes auth.conf from the table.
const Regenerate = "go run ./cmd/broadcast authconf -o auth.conf"

// authConfHeader explains the generated file to whoever opens it.
const authConfHeader = `# Users and permissions of Broadcast's nats-servers: nats.conf and the
# cluster nodes (deploy/cluster/n*.conf) include this file.
#
# Generated from the table in internal/permissions (users.go) by
#   ` + Regenerate + `
# Edit the table, not this file: internal/permissions' test fails when the
# two differ. ` + "`broadcast authconf -nsc`" + ` prints the same users as nsc commands.
#
# Least privilege: one user per service, ` + "`operator`" + ` for people and the nats
# CLI, a read-only ` + "`viewer`" + ` (progress and account health only), and ` + "`admin`" + `,
# the only user that may create or change streams (it runs ` + "`broadcast setup`" + `;
# the services only check the topology). Each is allowed only the subjects
# it needs. Nobody gets in without a user (there is no no_auth_user). The
# passwords are bcrypt hashes of the development passwords in .env
# (operator) and the Procfile (services, admin), at a low cost (6): these
# passwords are public anyway, and every connect and reconnect of every
# client pays the cost (after a server restart they all reconnect at once).
# For production, replace them (` + "`nats server passwd`" + ` makes a cost-11 hash) or
# better use NATS_CREDS, whose signature check is cheap (docs/operations.md).
#
# What each grant is for:
#   broadcast.*                 the contract's subjects, per service
#   $KV.<bucket>.>              writing a KV bucket (a put is a publish)
#   $O.<bucket>.>               writing an object store
#   $JS.API.STREAM.INFO.<stream>  stream info (checking the topology, opening a bucket)
#   $JS.API.STREAM.CREATE|UPDATE.<stream>  creating and changing the topology: admin only
#   $JS.API.DIRECT.GET.<stream>.> and STREAM.MSG.GET.<stream>: KV and message reads
#   $JS.API.CONSUMER.CREATE.<stream>.>  consumers; KV watches are short-lived ones
#   $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>  pulling from a consumer
#   $JS.ACK.<stream>.<consumer>.>  acknowledging (ack, nak, term, in progress)
#   $JS.FC.>                    flow control replies of push consumers (KV watches)
#   _INBOX.> (subscribe)        replies to the client's own requests
#   allow_responses             answering requests it serves (ingest: control;
#                               dispatch: re-queue) without publishing on _INBOX.>
#
# e2e/security_test.go runs the whole pipeline under these users, fails on
# any permission violation, and asserts every denial it lists.
`

// lineWidth is where auth.conf's lists and comments wrap.
const lineWidth = 120

// AuthConf returns auth.conf: the authorization block of every server
// configuration, generated from Users.
func AuthConf() []byte {
	var b strings.Builder
	b.WriteString(authConfHeader)
	b.WriteString("authorization {\n  users: [\n")
	for _, u := range Users() {
		writeComment(&b, "    ", u.About)
		b.WriteString("    {\n")
		fmt.Fprintf(&b, "      user: %s\n", u.Name)
		fmt.Fprintf(&b, "      password: %q\n", u.PasswordHash)
		b.WriteString("      permissions: {\n")
		writeRules(&b, "publish", u.Publish)
		writeRules(&b, "subscribe", u.Subscribe)
		if u.AllowResponses {
			b.WriteString("        # replies to the requests it serves, without publish rights on _INBOX.>\n")
			b.WriteString("        allow_responses: true\n")
		}
		b.WriteString("      }\n    }\n")
	}
	b.WriteString("  ]\n}\n")
	return []byte(b.String())
}

// writeRules writes a publish or subscribe block.
func writeRules(b *strings.Builder, name string, r Rules) {
	if len(r.Allow) == 0 && len(r.Deny) == 0 {
		return
	}
	fmt.Fprintf(b, "        %s: {\n", name)
	writeList(b, "allow", r.Allow)
	writeList(b, "deny", r.Deny)
	b.WriteString("        }\n")
}

// writeList writes an allow or deny list, each grant under its comment.
func writeList(b *strings.Builder, name string, grants []Grant) {
	if len(grants) == 0 {
		return
	}
	const indent = "            "
	fmt.Fprintf(b, "          %s: [\n", name)
	for gi, g := range grants {
		writeComment(b, indent, g.Why)
		line := indent
		for si, s := range g.Subjects {
			item := fmt.Sprintf("%q", s)
			if gi < len(grants)-1 || si < len(g.Subjects)-1 {
				item += ","
			}
			if line != indent && len(line)+1+len(item) > lineWidth {
				b.WriteString(line + "\n")
				line = indent
			}
			if line != indent {
				line += " "
			}
			line += item
		}
		b.WriteString(line + "\n")
	}
	b.WriteString("          ]\n")
}

// writeComment writes text as # lines wrapped at lineWidth.
func writeComment(b *strings.Builder, indent, text string) {
	line := indent + "#"
	for _, w := range strings.Fields(text) {
		if line != indent+"#" && len(line)+1+len(w) > lineWidth {
			b.WriteString(line + "\n")
			line = indent + "#"
		}
		line += " " + w
	}
	b.WriteString(line + "\n")
}
