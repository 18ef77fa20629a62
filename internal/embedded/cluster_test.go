package embedded

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStartClusterMovesOffATakenPort gives the cluster's first try a client
// port that another listener holds: the node cannot bind it, StartCluster
// notices at once from its fatal log line and starts on new ports.
func TestStartClusterMovesOffATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	calls := 0
	choosePorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if calls == 1 && err == nil {
			ports[1] = takenPort // node 2's client port
		}
		return ports, err
	}
	t.Cleanup(func() { choosePorts = freePorts })

	start := time.Now()
	cl, err := StartCluster(ClusterConfig{StoreDir: t.TempDir()})
	require.NoError(t, err)
	defer cl.Shutdown()
	took := time.Since(start)
	t.Logf("cluster ready in %s after %d tries", took.Round(time.Millisecond), calls)
	require.Equal(t, 2, calls, "one try on the taken port, one on new ports")
	require.Less(t, took, 20*time.Second, "the taken port is noticed before WaitReady's 30 s timeout")
	for _, s := range cl.Servers {
		require.NotEqual(t, takenPort, s.Addr().(*net.TCPAddr).Port)
	}
}

// TestStartClusterGivesUpOnAPortAlwaysTaken: three tries, then the error
// names the node and the port.
func TestStartClusterGivesUpOnAPortAlwaysTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	calls := 0
	choosePorts = func(n int) ([]int, error) {
		calls++
		ports, err := freePorts(n)
		if err == nil {
			ports[n-1] = takenPort // the last node's route port
		}
		return ports, err
	}
	t.Cleanup(func() { choosePorts = freePorts })

	_, err = StartCluster(ClusterConfig{StoreDir: t.TempDir()})
	require.ErrorIs(t, err, errPortTaken)
	require.ErrorContains(t, err, "n3")
	require.Equal(t, portAttempts, calls)
}
