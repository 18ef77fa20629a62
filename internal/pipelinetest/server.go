package pipelinetest

import (
	"testing"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/internal/topologytest"
	"github.com/broadcastd/broadcast/shared"
)

// Server is a natstest server with Broadcast's topology in place: every
// stream and bucket the services need.
type Server struct {
	*natstest.Server
}

// Start runs a JetStream server for the test and creates the topology.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWithTopology(t, shared.TopologyConfig{})
}

// StartWithTopology is Start with the topology built from topo (a short
// Retention, say).
func StartWithTopology(t testing.TB, topo shared.TopologyConfig) *Server {
	t.Helper()
	return &Server{natstest.StartWith(t, topologytest.Setup(topo))}
}

// ConfigServer is natstest.ConfigServer with the topology.
type ConfigServer struct {
	*Server
	// Log holds the server's error and warning lines.
	Log *natstest.ServerLog
}

// StartConfigFile is natstest.StartConfigFile with the topology as its
// Setup, created as o.SetupAs (a service user: the operator may not).
func StartConfigFile(t testing.TB, path string, o natstest.ConfigOptions) *ConfigServer {
	t.Helper()
	o.Setup = topologytest.Setup(shared.TopologyConfig{})
	cs := natstest.StartConfigFile(t, path, o)
	return &ConfigServer{Server: &Server{cs.Server}, Log: cs.Log}
}

// Cluster is natstest.Cluster with the topology created with one replica
// per node.
type Cluster struct {
	// Server is the client side: its URL lists every node, so
	// StartPipeline and the helpers (Progress, WaitFinal, PutAccount, ...)
	// work unchanged and fail over between nodes. Its embedded
	// *server.Server is node 0 at start; kill nodes with Nodes.Kill, not
	// with its Shutdown.
	*Server
	// Nodes are the servers.
	Nodes *embedded.Cluster
	// Log collects every node's errors and warnings (permission
	// violations among them).
	Log *natstest.ServerLog
}

// StartCluster is natstest.StartCluster with the topology as its Setup.
func StartCluster(t testing.TB, o natstest.ClusterOptions) *Cluster {
	t.Helper()
	o.Setup = topologytest.Setup(shared.TopologyConfig{Replicas: o.NodeCount()})
	c := natstest.StartCluster(t, o)
	return &Cluster{Server: &Server{c.Server}, Nodes: c.Nodes, Log: c.Log}
}

// NATSConfig is the config a service under test connects with.
func (ts *Server) NATSConfig() shared.NATSConfig {
	return shared.NATSConfig{URL: ts.URL, User: ts.Creds.User, Password: ts.Creds.Password}
}
