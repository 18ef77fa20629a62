package process

import (
	"strconv"
	"testing"
	"time"

	"github.com/broadcastd/broadcast/internal/proctest"
)

// stack is a test's own nats-server and gateway processes and its client
// of that server; the services it starts connect to that server.
type stack struct {
	t   *testing.T
	ns  *proctest.Proc // nats-server, on a store in t.TempDir()
	gw  *proctest.Proc // the gateway the accounts send to
	c   *chaosClient
	env string // NATS_URL of ns, first in every service's environment
}

// startStack starts nats-server, then the gateway (latency added to each
// request, 0 for none; its fault seed; any more flags), then the client,
// which creates the topology.
func startStack(t *testing.T, latency time.Duration, seed int, gatewayFlags ...string) *stack {
	t.Helper()
	ns := proctest.StartNATS(t, t.TempDir(), 0)
	gw := proctest.StartGateway(t, append([]string{"-latency", latency.String(), "-seed", strconv.Itoa(seed)}, gatewayFlags...)...)
	return &stack{t: t, ns: ns, gw: gw, c: newChaosClient(t, ns.URL), env: "NATS_URL=" + ns.URL}
}

// start runs service name as a process on the stack's server, with
// extraEnv after NATS_URL, and waits until it says it started.
func (s *stack) start(name string, extraEnv ...string) *proctest.Proc {
	s.t.Helper()
	p := proctest.StartService(s.t, name, append([]string{s.env}, extraEnv...)...)
	p.WaitLog(name+" started", 30*time.Second)
	return p
}

// startAll starts each of names in turn.
func (s *stack) startAll(names ...string) []*proctest.Proc {
	s.t.Helper()
	var procs []*proctest.Proc
	for _, name := range names {
		procs = append(procs, s.start(name))
	}
	return procs
}

// replicas starts n processes of service name in turn, each with extraEnv.
func (s *stack) replicas(n int, name string, extraEnv ...string) []*proctest.Proc {
	s.t.Helper()
	procs := make([]*proctest.Proc, n)
	for i := range procs {
		procs[i] = s.start(name, extraEnv...)
	}
	return procs
}
