package natstest

import (
	"net/url"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/embedded"
)

// ClusterOptions tunes StartCluster.
type ClusterOptions struct {
	// Nodes is how many servers to run. Defaults to 3, or to the number of
	// ConfigFiles.
	Nodes int
	// SyncAlways sets jetstream { sync_interval: always } on every node.
	SyncAlways bool
	// ConfigFiles, when set, are node configurations (for example
	// deploy/cluster/n1.conf ...): each node takes its server name, users
	// and permissions, route credentials and TLS, max payload and sync setting from
	// its file, while ports, routes and stores are the test's own.
	ConfigFiles []string
	// SetupAs is the user that runs Setup (required with users).
	SetupAs Credentials
	// ClientAs is the user of the Server's own client. Defaults to SetupAs.
	ClientAs Credentials
	// Setup, when set, prepares the cluster once it has a meta leader,
	// before StartCluster returns.
	Setup Setup
}

// NodeCount is how many servers StartCluster runs for o: Nodes, or 3, or
// the number of ConfigFiles when there are more.
func (o ClusterOptions) NodeCount() int {
	if o.Nodes != 0 {
		return o.Nodes
	}
	return max(3, len(o.ConfigFiles))
}

// Cluster is a JetStream cluster of embedded servers for one test, with a
// client connected to every node.
type Cluster struct {
	// Server is the client side: its URL lists every node, so what works
	// on a single Server works here and fails over between nodes. Its
	// embedded *server.Server is node 0 at start; kill nodes with
	// Nodes.Kill, not with its Shutdown.
	*Server
	// Nodes are the servers.
	Nodes *embedded.Cluster
	// Log collects every node's errors and warnings (permission
	// violations among them).
	Log *ServerLog
}

// StartCluster runs a cluster on loopback ports with stores in t.TempDir(),
// waits for a meta leader and runs o.Setup.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	o.Nodes = o.NodeCount()
	var files []*server.Options
	for _, f := range o.ConfigFiles {
		fo, err := server.ProcessConfigFile(f)
		require.NoError(t, err, "parse %s", f)
		files = append(files, fo)
	}
	dir := t.TempDir()
	log := &ServerLog{}
	cl, err := embedded.StartCluster(embedded.ClusterConfig{
		Nodes: o.Nodes, StoreDir: dir, SyncAlways: o.SyncAlways,
		Configure: func(i int, opts *server.Options) {
			if i >= len(files) {
				return
			}
			fo := files[i]
			opts.ServerName = fo.ServerName
			opts.Users, opts.NoAuthUser = fo.Users, fo.NoAuthUser
			opts.MaxPayload = fo.MaxPayload
			opts.SyncAlways, opts.SyncInterval = fo.SyncAlways, fo.SyncInterval
			opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = fo.Cluster.TLSConfig, fo.Cluster.TLSTimeout
			if fo.Cluster.Username != "" {
				opts.Cluster.Username, opts.Cluster.Password = fo.Cluster.Username, fo.Cluster.Password
				var routes []*url.URL
				for _, r := range opts.Routes {
					cp := *r
					cp.User = url.UserPassword(fo.Cluster.Username, fo.Cluster.Password)
					routes = append(routes, &cp)
				}
				opts.Routes = routes
			}
		},
		Logger: log,
	})
	require.NoError(t, err)
	t.Cleanup(cl.Shutdown)
	ts := &Server{Server: cl.Servers[0], URL: cl.ClientURLs(), Dir: dir, Creds: o.SetupAs}
	ts.connect(t, o.Setup)
	if o.ClientAs.User != "" && o.ClientAs != o.SetupAs {
		ts.NC.Close()
		ts.Creds = o.ClientAs
		ts.connect(t, nil)
	}
	return &Cluster{Server: ts, Nodes: cl, Log: log}
}
