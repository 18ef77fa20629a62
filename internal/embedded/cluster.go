package embedded

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ClusterConfig tunes a JetStream cluster of embedded servers on one machine.
type ClusterConfig struct {
	// Nodes is how many servers to run. Defaults to 3.
	Nodes int
	// StoreDir holds one subdirectory per node (n1, n2, ...). Required.
	StoreDir string
	// Name is the cluster's name. Defaults to "broadcast".
	Name string
	// SyncAlways makes every node fsync each write before acknowledging it
	// (jetstream { sync_interval: always }). Defaults to false: the server's
	// own default, an fsync every 2 minutes.
	SyncAlways bool
	// Logger, when set, receives every node's log lines.
	Logger server.Logger
	// Configure, when set, is called with each node's options before it
	// starts, e.g. to add authorization.
	Configure func(node int, opts *server.Options)
}

// Cluster is a running JetStream cluster of embedded servers listening on
// 127.0.0.1. Every node keeps its client and route ports across Restart, so
// clients given ClientURLs find it again.
type Cluster struct {
	// Servers are the nodes, in order; an entry is nil while its node is
	// down.
	Servers []*server.Server

	cfg  ClusterConfig
	opts []server.Options // each node's options as first built, copied on every start
	logs []*nodeLog       // each running node's logger
}

// nodeName is node i's server and store directory name: n1, n2, ...
func nodeName(i int) string { return fmt.Sprintf("n%d", i+1) }

// portAttempts is how many sets of ports StartCluster tries: the ports are
// free when chosen, but another process (or an outgoing connection's local
// port) may take one before its node binds it.
const portAttempts = 3

// errPortTaken is a node failing to bind one of its ports.
var errPortTaken = errors.New("port taken")

// StartCluster runs the nodes, routed to each other, and waits until
// JetStream has a meta leader and every node is current. When a node finds
// one of its ports taken, it starts the cluster again on other ports.
func StartCluster(c ClusterConfig) (*Cluster, error) {
	if c.StoreDir == "" {
		return nil, errors.New("embedded: ClusterConfig.StoreDir is required")
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Name == "" {
		c.Name = "broadcast"
	}
	for attempt := 1; ; attempt++ {
		cl, err := startCluster(c)
		if err == nil || attempt == portAttempts || !errors.Is(err, errPortTaken) {
			return cl, err
		}
		for i := range c.Nodes {
			if err := os.RemoveAll(filepath.Join(c.StoreDir, nodeName(i))); err != nil {
				return nil, fmt.Errorf("embedded: clearing a store for new ports: %w", err)
			}
		}
	}
}

// startCluster is one try of StartCluster on newly chosen ports.
func startCluster(c ClusterConfig) (*Cluster, error) {
	// One call, so that no two of the cluster's ports are the same.
	ports, err := choosePorts(2 * c.Nodes)
	if err != nil {
		return nil, err
	}
	clientPorts, routePorts := ports[:c.Nodes], ports[c.Nodes:]
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	cl := &Cluster{Servers: make([]*server.Server, c.Nodes), logs: make([]*nodeLog, c.Nodes), cfg: c}
	for i := range c.Nodes {
		o := server.Options{
			ServerName: nodeName(i),
			Host:       "127.0.0.1",
			Port:       clientPorts[i],
			StoreDir:   filepath.Join(c.StoreDir, nodeName(i)),
			Cluster: server.ClusterOpts{
				Name: c.Name,
				Host: "127.0.0.1",
				Port: routePorts[i],
			},
			Routes:     routes,
			SyncAlways: c.SyncAlways,
		}
		if c.Configure != nil {
			c.Configure(i, &o)
		}
		cl.opts = append(cl.opts, o)
	}
	// Every node must start before any is ready: a JetStream cluster only
	// elects a meta leader once a quorum of routes is up.
	for i := range c.Nodes {
		if cl.Servers[i], err = cl.startNode(i, false); err != nil {
			cl.Shutdown()
			return nil, err
		}
	}
	if err := cl.WaitReady(30 * time.Second); err != nil {
		cl.Shutdown()
		return nil, err
	}
	return cl, nil
}

// startNode builds and starts node i from its saved options.
func (cl *Cluster) startNode(i int, wait bool) (*server.Server, error) {
	o := cl.opts[i] // a copy: the server keeps and mutates its own
	o.Routes = append([]*url.URL(nil), cl.opts[i].Routes...)
	o.JetStream = true
	o.NoSigs = true
	if o.MaxPayload == 0 {
		o.MaxPayload = MaxPayload
	}
	s, err := server.NewServer(&o)
	if err != nil {
		return nil, fmt.Errorf("embedded: node %d: %w", i+1, err)
	}
	cl.logs[i] = &nodeLog{next: cl.cfg.Logger}
	s.SetLogger(cl.logs[i], false, false)
	go s.Start()
	if wait && !s.ReadyForConnections(15*time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded: node %d not ready after 15s", i+1)
	}
	return s, nil
}

// WaitReady waits until every running node accepts clients, one of them is
// the JetStream meta leader, and every running node is current with it.
func (cl *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i, s := range cl.Servers {
		for s != nil && !s.ReadyForConnections(100*time.Millisecond) {
			if fatal := cl.logs[i].fatal(); fatal != "" {
				if strings.Contains(fatal, "address already in use") {
					return fmt.Errorf("embedded: %s: %w: %s", s.Name(), errPortTaken, fatal)
				}
				return fmt.Errorf("embedded: %s: %s", s.Name(), fatal)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("embedded: %s not accepting clients after %s", s.Name(), timeout)
			}
		}
	}
	for time.Now().Before(deadline) {
		leader, current := false, true
		for _, s := range cl.Servers {
			if s == nil {
				continue
			}
			leader = leader || s.JetStreamIsLeader()
			current = current && s.JetStreamIsCurrent()
		}
		if leader && current {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("embedded: no JetStream meta leader after %s", timeout)
}

// ClientURLs is every node's client URL, comma separated: what NATS_URL
// holds for a client that should fail over between nodes.
func (cl *Cluster) ClientURLs() string {
	var urls []string
	for _, o := range cl.opts {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", o.Port))
	}
	return strings.Join(urls, ",")
}

// StreamLeader returns the index of the node leading stream in account
// ("$G" without authorization), or -1 when no running node leads it.
func (cl *Cluster) StreamLeader(account, stream string) int {
	for i, s := range cl.Servers {
		if s != nil && s.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// Kill shuts node i down at once, as a crash looks to its peers and
// clients. Its store stays for Restart.
func (cl *Cluster) Kill(i int) {
	if s := cl.Servers[i]; s != nil {
		s.Shutdown()
		s.WaitForShutdown()
		cl.Servers[i] = nil
	}
}

// Restart starts node i again on its ports and store.
func (cl *Cluster) Restart(i int) error {
	cl.Kill(i)
	s, err := cl.startNode(i, true)
	if err != nil {
		return err
	}
	cl.Servers[i] = s
	return nil
}

// Shutdown stops every node; calling it twice is safe.
func (cl *Cluster) Shutdown() {
	for i := range cl.Servers {
		cl.Kill(i)
	}
}

// choosePorts is freePorts, replaced in tests.
var choosePorts = freePorts

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("embedded: free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
