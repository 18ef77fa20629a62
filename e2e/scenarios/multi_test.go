package scenarios

import (
	"testing"

	"github.com/broadcastd/broadcast/internal/proctest"
	"github.com/broadcastd/broadcast/internal/scenario"
)

// multiprocessStack runs the scenario's services as processes of the
// broadcast binary (built once per test binary), which the scenario's
// kills hit with SIGKILL; its nats-server restarts in place.
func multiprocessStack(t *testing.T) scenario.StartFunc {
	return scenario.StartProcesses(proctest.BuildBinaries(t).Broadcast)
}
