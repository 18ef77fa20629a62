package proctest

import (
	"context"
	"os"
	"os/exec"
	"testing"
)

// RunSetup runs `broadcast setup` with env added to the environment, as
// StartService runs a service (env must set NATS_URL, and NATS_USER and
// NATS_PASSWORD when the server has users: admin), until it exits or
// ReadyTimeout passes. It returns the output (one line per stream, bucket
// and object store, and a summary; or why it failed) and the exit error.
func RunSetup(t testing.TB, env ...string) (string, error) {
	t.Helper()
	bins := BuildBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bins.Broadcast, "setup")
	cmd.Env = append(append(os.Environ(), serviceEnv...), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
