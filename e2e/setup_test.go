package e2e

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/proctest"
	"github.com/broadcastd/broadcast/shared"
)

// TestSetupBeforeServices runs nats.conf's server and the binaries the way
// the Procfile does, in the order it cannot guarantee: a service started
// before `broadcast setup` waits (saying so) and starts once admin has
// created the topology. Setup as a user without the grants (the operator,
// a service) is refused, naming the violation; run again as admin it
// changes nothing. The only permission violations in the server's log are
// those refused setups': the service never tried to create a stream.
func TestSetupBeforeServices(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs binaries")
	}
	t.Parallel()
	svc, op := devCredentials(t)
	ns := proctest.StartNATS(t, t.TempDir(), 0, "-c", procNATSConf(t))
	as := func(c struct{ User, Password string }) []string {
		return []string{"NATS_URL=" + ns.URL, "NATS_USER=" + c.User, "NATS_PASSWORD=" + c.Password}
	}
	ingest := proctest.StartService(t, "ingest", append(as(svc["ingest"]), "LOG_FORMAT=json")...)
	ingest.WaitLog("waiting for the topology", 60*time.Second)
	require.Contains(t, ingest.CurrentLogs(), "run `broadcast setup`")

	for _, who := range []struct{ User, Password string }{op, svc["ingest"]} {
		out, err := proctest.RunSetup(t, as(who)...)
		require.Error(t, err, "setup as %s must fail:\n%s", who.User, out)
		require.Contains(t, out, "permissions violation", "setup as %s", who.User)
		require.Contains(t, out, "auth.conf's admin", "setup as %s", who.User)
	}

	out, err := proctest.RunSetup(t, as(svc["setup"])...)
	require.NoError(t, err, "setup as admin:\n%s", out)
	require.Contains(t, out, fmt.Sprintf("topology in place: %d created, 0 updated, 0 unchanged", topologyParts()))
	ingest.WaitLog("topology in place", 30*time.Second)
	ingest.WaitLog("ingest started", 30*time.Second)

	out, err = proctest.RunSetup(t, as(svc["setup"])...)
	require.NoError(t, err, "setup again:\n%s", out)
	require.Contains(t, out, fmt.Sprintf("topology in place: 0 created, 0 updated, %d unchanged", topologyParts()))

	violations := regexp.MustCompile(`(?m)^.*Violation.*$`).FindAllString(ns.Logs(), -1)
	require.NotEmpty(t, violations, "the refused setups")
	for _, v := range violations {
		require.Regexp(t, `(operator|ingest)" - Publish Violation - Subject "\$JS\.API\.STREAM\.(INFO|CREATE|UPDATE)\.`, v)
		require.NotContains(t, v, "broadcast-ingest", "the ingest service itself: %s", v)
	}
}

// topologyParts is how many streams, buckets and object stores setup makes.
func topologyParts() int {
	c := shared.TopologyConfig{}
	return len(shared.Streams(c)) + len(shared.Buckets(c)) + len(shared.ObjectStores(c))
}
