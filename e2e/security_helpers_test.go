package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/pipelinetest"
	"github.com/broadcastd/broadcast/shared"
)

// The files the least-privilege tests read: the repository's own, so the
// tests prove what a developer runs.
const (
	natsConfPath = "../nats.conf"
	procfilePath = "../Procfile"
	dotEnvPath   = "../.env"
)

// serviceNames are the services that connect with their own users.
var serviceNames = []string{"ingest", "render", "dispatch", "status", "feedback"}

var procfileCreds = regexp.MustCompile(`\bNATS_USER=(\S+)\s+NATS_PASSWORD=(\S+)`)

// viewerDevPassword is the development password of auth.conf's read-only
// viewer user (auth.conf keeps its bcrypt hash).
const viewerDevPassword = "dev-viewer-pw"

// devCredentials reads each service's credentials from its Procfile line
// (and admin's from the setup line, under "setup") and the operator's from
// .env.

func devCredentials(t *testing.T) (services map[string]natstest.Credentials, operator natstest.Credentials) {
	t.Helper()
	services = map[string]natstest.Credentials{}
	f, err := os.Open(procfilePath)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		if m := procfileCreds.FindStringSubmatch(rest); m != nil {
			services[strings.TrimSpace(name)] = natstest.Credentials{User: m[1], Password: m[2]}
		}
	}
	require.NoError(t, sc.Err())
	for _, s := range serviceNames {
		require.Contains(t, services, s, "Procfile line %q sets NATS_USER and NATS_PASSWORD", s)
		require.Equal(t, s, services[s].User, "the %s line connects as user %s", s, s)
	}
	require.Contains(t, services, "setup", "Procfile line \"setup\" sets NATS_USER and NATS_PASSWORD")
	require.Equal(t, "admin", services["setup"].User, "the setup line connects as admin")
	env := readDotEnv(t)
	operator = natstest.Credentials{User: env["NATS_USER"], Password: env["NATS_PASSWORD"]}
	require.Equal(t, "operator", operator.User, ".env NATS_USER")
	require.NotEmpty(t, operator.Password, ".env NATS_PASSWORD")
	return services, operator
}

// readDotEnv parses KEY=VALUE lines, ignoring comments and blank lines.
func readDotEnv(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(dotEnvPath)
	require.NoError(t, err)
	out := map[string]string{}
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if ok {
			out[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return out
}

// startSecureServer runs nats.conf with its users: the topology is created
// as admin (as `broadcast setup` is) and the test's client is the operator.
func startSecureServer(t *testing.T, o natstest.ConfigOptions) (*pipelinetest.ConfigServer, map[string]natstest.Credentials, natstest.Credentials) {
	t.Helper()
	svc, op := devCredentials(t)
	o.SetupAs, o.ClientAs = svc["setup"], op
	return pipelinetest.StartConfigFile(t, natsConfPath, o), svc, op
}

// submitAsOperator publishes task with the Server's own client.
func submitAsOperator(t *testing.T, ts *pipelinetest.Server, task contract.Task) {
	t.Helper()
	data, err := json.Marshal(task)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = client.Submit(ctx, ts.JS, data)
	require.NoError(t, err)
}

// requireNoSecret fails the test when text contains secret, quoting the
// line it is on (with the secret marked) rather than the whole text.
func requireNoSecret(t *testing.T, where, text, secret string) {
	t.Helper()
	for line := range strings.SplitSeq(text, "\n") {
		if strings.Contains(line, secret) {
			t.Fatalf("%s contains the secret: %s", where, strings.ReplaceAll(line, secret, "<<THE SECRET>>"))
		}
	}
}

// allStreams is every stream of the topology: the work streams, and the
// streams behind every KV bucket and object store.
func allStreams() []string {
	var out []string
	for _, s := range shared.Streams(shared.TopologyConfig{}) {
		out = append(out, s.Name)
	}
	for _, b := range shared.Buckets(shared.TopologyConfig{}) {
		out = append(out, "KV_"+b.Bucket)
	}
	for _, o := range shared.ObjectStores(shared.TopologyConfig{}) {
		out = append(out, "OBJ_"+o.Bucket)
	}
	return out
}

// streamMessages returns every stored message of stream, subject, headers
// and data as one string each.
func streamMessages(t *testing.T, ts *pipelinetest.Server, stream string) []string {
	t.Helper()
	var out []string
	for _, m := range natstest.StoredMsgs(t, ts.JS, stream) {
		out = append(out, fmt.Sprintf("%s %v %s", m.Subject, m.Header, m.Data))
	}
	return out
}
