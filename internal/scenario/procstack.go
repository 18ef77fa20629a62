package scenario

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/internal/embedded"
	"github.com/broadcastd/broadcast/shared"
)

// processes is the multi-process stack: the four services as OS processes
// of the broadcast binary (ReplicasEnv of each), killed with SIGKILL and
// started again, and a nats-server in this process on a fixed port and
// store, shut down and started again for a "nats" kill (clients reconnect
// to the same URL).
type processes struct {
	bin   string
	dir   string
	port  int
	env   []string
	mu    sync.Mutex
	srv   *server.Server
	procs map[string]*exec.Cmd
	done  map[string]chan struct{}
}

// StartProcesses returns a StartFunc that runs each service as a process
// of bin (the broadcast command: `bin ingest`, ...). Service logs go to
// files in a temporary directory that Close removes unless
// SCENARIO_KEEP_LOGS is set.
func StartProcesses(bin string) StartFunc {
	return func(ctx context.Context, env map[string]string) (Stack, error) {
		dir, err := os.MkdirTemp("", "broadcast-scenario-mp-")
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		p := &processes{bin: bin, dir: dir, port: port, procs: map[string]*exec.Cmd{}, done: map[string]chan struct{}{}}
		if err := p.startNATS(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		nc, err := nats.Connect(p.URL())
		if err != nil {
			p.Close()
			return nil, err
		}
		js, _ := jetstream.New(nc)
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = shared.EnsureTopology(tctx, js, shared.TopologyConfig{})
		cancel()
		nc.Close()
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("topology: %w", err)
		}
		p.env = append(os.Environ(), "NATS_URL="+p.URL(), "DASHBOARD_ADDR=off", "METRICS_ADDR=", "LOG_FORMAT=json")
		for k, v := range env {
			p.env = append(p.env, k+"="+v)
		}
		replicas, _ := strconv.Atoi(env[ReplicasEnv])
		for _, service := range []string{"ingest", "render", "dispatch", "status"} {
			for k := range max(1, replicas) {
				if err := p.start(ReplicaName(service, k)); err != nil {
					p.Close()
					return nil, err
				}
			}
		}
		// The services connect and create their consumers.
		time.Sleep(2 * time.Second)
		return p, nil
	}
}

func (p *processes) startNATS() error {
	srv, err := embedded.Start(embedded.Config{Port: p.port, StoreDir: filepath.Join(p.dir, "nats")})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.srv = srv
	p.mu.Unlock()
	return nil
}

func (p *processes) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", p.port) }

func (p *processes) start(name string) error {
	log, err := os.OpenFile(filepath.Join(p.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	service, _, _ := strings.Cut(name, "-") // "dispatch-2" runs dispatch
	cmd := exec.Command(p.bin, service)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = groupAttr()
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); log.Close(); close(done) }()
	p.mu.Lock()
	p.procs[name], p.done[name] = cmd, done
	p.mu.Unlock()
	return nil
}

// Kill kills a service with SIGKILL and starts it again, or restarts the
// nats-server ("nats") after a second down.
func (p *processes) Kill(name string) error {
	if name == "nats" {
		p.mu.Lock()
		srv := p.srv
		p.mu.Unlock()
		srv.Shutdown()
		srv.WaitForShutdown()
		time.Sleep(time.Second)
		return p.startNATS()
	}
	p.mu.Lock()
	cmd, done := p.procs[name], p.done[name]
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("no process %s", name)
	}
	killGroup(cmd, true)
	<-done
	return p.start(name)
}

func (p *processes) Close() {
	p.mu.Lock()
	procs := p.procs
	dones := p.done
	p.mu.Unlock()
	for name, cmd := range procs {
		killGroup(cmd, false)
		select {
		case <-dones[name]:
		case <-time.After(10 * time.Second):
			killGroup(cmd, true)
			<-dones[name]
		}
	}
	p.mu.Lock()
	srv := p.srv
	p.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
	if os.Getenv("SCENARIO_KEEP_LOGS") == "" {
		os.RemoveAll(p.dir)
	} else {
		fmt.Fprintf(os.Stderr, "scenario: service logs kept in %s\n", p.dir)
	}
}
