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
	// Node 2's client port, in the first try only.
	takenPort, calls := takePort(t, func(call, n int) int {
		if call == 1 {
			return 1
		}
		return -1
	})
	start := time.Now()
	cl, err := StartCluster(ClusterConfig{StoreDir: t.TempDir()})
	require.NoError(t, err)
	defer cl.Shutdown()
	took := time.Since(start)
	t.Logf("cluster ready in %s after %d tries", took.Round(time.Millisecond), *calls)
	require.Equal(t, 2, *calls, "one try on the taken port, one on new ports")
	require.Less(t, took, 20*time.Second, "the taken port is noticed before WaitReady's 30 s timeout")
	for _, s := range cl.Servers {
		require.NotEqual(t, takenPort, s.Addr().(*net.TCPAddr).Port)
	}
}

// TestStartClusterGivesUpOnAPortAlwaysTaken: three tries, then the error
// names the node and the port.
func TestStartClusterGivesUpOnAPortAlwaysTaken(t *testing.T) {
	// The last node's route port, in every try.
	_, calls := takePort(t, func(call, n int) int { return n - 1 })
	_, err := StartCluster(ClusterConfig{StoreDir: t.TempDir()})
	require.ErrorIs(t, err, errPortTaken)
	require.ErrorContains(t, err, "n3")
	require.Equal(t, portAttempts, *calls)
}

// takePort holds a loopback port for the test and makes StartCluster's
// call-th choice of n ports put it at index at(call, n) (none when
// negative). It returns the port and the count of choices made.
func takePort(t *testing.T, at func(call, n int) int) (int, *int) {
	t.Helper()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })
	port := taken.Addr().(*net.TCPAddr).Port
	calls := new(int)
	choosePorts = func(n int) ([]int, error) {
		*calls++
		ports, err := freePorts(n)
		if i := at(*calls, n); err == nil && i >= 0 {
			ports[i] = port
		}
		return ports, err
	}
	t.Cleanup(func() { choosePorts = freePorts })
	return port, calls
}
