package permissions

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/shared"
)

// TestCommittedAuthConfIsGenerated: the auth.conf that nats.conf and the
// cluster nodes include is exactly what the table generates.
func TestCommittedAuthConfIsGenerated(t *testing.T) {
	committed, err := os.ReadFile("../../auth.conf")
	require.NoError(t, err)
	want := AuthConf()
	if bytes.Equal(committed, want) {
		return
	}
	got, exp := strings.Split(string(committed), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(got), len(exp)) {
		g, e := "", ""
		if i < len(got) {
			g = got[i]
		}
		if i < len(exp) {
			e = exp[i]
		}
		if g != e {
			t.Fatalf("auth.conf is not what internal/permissions generates; run from the repository root:\n  %s\n"+
				"first difference, line %d:\n  committed: %s\n  generated: %s", Regenerate, i+1, g, e)
		}
	}
}

// TestAuthConfUsers parses the generated file as nats-server does: every
// user has a bcrypt hash and permissions, and admin is the only one that
// may create or update a stream of the topology, or any other stream.
func TestAuthConfUsers(t *testing.T) {
	opts := parse(t, AuthConf())
	require.Len(t, opts.Users, len(Users()))
	streams := append(allStreams(), "EVIL")
	for _, u := range opts.Users {
		require.True(t, strings.HasPrefix(u.Password, "$2a$06$"), "user %s: a bcrypt hash", u.Username)
		require.NotNil(t, u.Permissions, "user %s has permissions", u.Username)
		require.NotNil(t, u.Permissions.Publish, "user %s has publish permissions", u.Username)
		for _, s := range streams {
			for _, api := range []string{"CREATE", "UPDATE", "DELETE"} {
				subject := "$JS.API.STREAM." + api + "." + s
				want := u.Username == "admin" && api != "DELETE" && s != "EVIL"
				require.Equal(t, want, allowed(u.Permissions.Publish, subject), "%s publish %s", u.Username, subject)
			}
		}
	}
}

// TestNSCCommandsMatchTable reads the nsc commands back: one per user,
// with every allow and deny of the table and the response permission.
func TestNSCCommandsMatchTable(t *testing.T) {
	type perms struct {
		flags     map[string][]string
		responses bool
	}
	got := map[string]*perms{}
	var cur *perms
	flag := regexp.MustCompile(`^\s*(--[a-z-]+)(?: '([^']*)')?(?: \\)?$`)
	for line := range strings.SplitSeq(string(NSC()), "\n") {
		if name, ok := strings.CutPrefix(line, "nsc add user --name "); ok {
			cur = &perms{flags: map[string][]string{}}
			got[strings.TrimSuffix(name, " \\")] = cur
			continue
		}
		if cur == nil || strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		m := flag.FindStringSubmatch(line)
		require.NotNil(t, m, "nsc line %q", line)
		if m[1] == "--allow-pub-response" {
			cur.responses = true
			continue
		}
		cur.flags[m[1]] = append(cur.flags[m[1]], strings.Split(m[2], ",")...)
	}
	flat := func(gs []Grant) []string {
		var out []string
		for _, g := range gs {
			out = append(out, g.Subjects...)
		}
		return out
	}
	require.Len(t, got, len(Users()))
	for _, u := range Users() {
		p := got[u.Name]
		require.NotNil(t, p, "nsc add user --name %s", u.Name)
		require.Equal(t, flat(u.Publish.Allow), p.flags["--allow-pub"], u.Name)
		require.Equal(t, flat(u.Publish.Deny), p.flags["--deny-pub"], u.Name)
		require.Equal(t, flat(u.Subscribe.Allow), p.flags["--allow-sub"], u.Name)
		require.Equal(t, flat(u.Subscribe.Deny), p.flags["--deny-sub"], u.Name)
		require.Equal(t, u.AllowResponses, p.responses, u.Name)
	}
}

// TestGrantsNameTheTopology: every stream a grant names is one of the
// topology's, so a renamed stream cannot leave a grant behind.
func TestGrantsNameTheTopology(t *testing.T) {
	known := map[string]bool{}
	for _, s := range shared.TopologyStreams() {
		known[s.Stream] = true
	}
	// The API subjects that name a stream right after these prefixes.
	prefixes := []string{"$JS.API.STREAM.MSG.GET.", "$JS.API.CONSUMER.MSG.NEXT.", "$JS.API.DIRECT.GET.", "$JS.ACK."}
	for _, op := range []string{"INFO", "CREATE", "UPDATE", "DELETE", "PURGE"} {
		prefixes = append(prefixes, "$JS.API.STREAM."+op+".")
	}
	for _, op := range []string{"CREATE", "DELETE", "INFO", "LIST", "NAMES"} {
		prefixes = append(prefixes, "$JS.API.CONSUMER."+op+".")
	}
	named := 0
	for _, u := range Users() {
		for _, g := range slices.Concat(u.Publish.Allow, u.Publish.Deny) {
			for _, s := range g.Subjects {
				for _, p := range prefixes {
					if rest, ok := strings.CutPrefix(s, p); ok {
						stream, _, _ := strings.Cut(rest, ".")
						if stream != "*" && stream != ">" {
							require.True(t, known[stream], "%s: %s names stream %s, not in shared.TopologyStreams", u.Name, s, stream)
							named++
						}
						break
					}
				}
			}
		}
	}
	require.Greater(t, named, 100, "grants naming a stream")
}

// parse reads conf as the authorization part of a server configuration.
func parse(t *testing.T, conf []byte) *server.Options {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "auth.conf"), conf, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nats.conf"), []byte("include ./auth.conf\n"), 0o644))
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	require.NoError(t, err)
	return opts
}

// allowed reports whether p lets a client publish on subject: an allow
// matches and no deny does.
func allowed(p *server.SubjectPermission, subject string) bool {
	match := func(list []string) bool {
		return slices.ContainsFunc(list, func(pattern string) bool { return matches(pattern, subject) })
	}
	return match(p.Allow) && !match(p.Deny)
}

// matches reports whether subject matches pattern (with * and >).
func matches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}
