package proctest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// portAttempts is how often a start on a port chosen by FreePort is retried
// on another one, in case something took the port in between.
const portAttempts = 3

// StartNATS runs nats-server with JetStream, its store in dir, on 127.0.0.1
// and port (0 picks a free one), and waits until its /healthz (on a monitoring
// port it also picks) says JetStream is ready. Restart runs it again on the
// same ports and store. extraArgs are added to the command line.
//
// The Proc's URL is nats://127.0.0.1:PORT.
func StartNATS(t testing.TB, dir string, port int, extraArgs ...string) *Proc {
	t.Helper()
	bins := BuildBinaries(t)
	return startOnPort(t, port, func(port int) Spec {
		mon := FreePort(t)
		health := fmt.Sprintf("http://127.0.0.1:%d/healthz", mon)
		args := append([]string{"-js", "-sd", dir, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mon)}, extraArgs...)
		return Spec{
			Name:  "nats",
			Path:  bins.NATSServer,
			Args:  args,
			URL:   fmt.Sprintf("nats://127.0.0.1:%d", port),
			Port:  port,
			Ready: func(ctx context.Context) error { return getOK(ctx, health) },
		}
	})
}

// serviceEnv comes before a service's own env: blank values override what
// the test's environment holds (the services treat a blank variable as
// unset), so a service never reaches a server outside the test, and the
// listeners on fixed ports are off, so tests running side by side do not
// collide on them.
var serviceEnv = []string{
	"NATS_USER=", "NATS_PASSWORD=", "NATS_CREDS=", "NATS_CA=", "NATS_CERT=", "NATS_KEY=",
	"DASHBOARD_ADDR=off", "METRICS_ADDR=", "PPROF_ADDR=", "FEEDBACK_ADDR=127.0.0.1:0",
}

// StartService runs `broadcast <name>` (ingest, render, dispatch, status or
// all) with env added to the environment. env must set NATS_URL, typically
// "NATS_URL="+nats.URL. The NATS credentials of the test's own environment
// are not passed on, and the status dashboard (DASHBOARD_ADDR) and metrics
// (METRICS_ADDR) listeners are off unless env sets them.
//
// Services have no ready check; use WaitLog (for example "dispatch started").
func StartService(t testing.TB, name string, env ...string) *Proc {
	t.Helper()
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "NATS_URL=") }) {
		t.Fatalf("proctest: StartService(%s): env must set NATS_URL", name)
	}
	bins := BuildBinaries(t)
	return Start(t, Spec{
		Name: name,
		Path: bins.Broadcast,
		Args: []string{name},
		Env:  append(slices.Clone(serviceEnv), env...),
	})
}

// StartGateway runs `broadcast gateway` with args and waits until it serves
// GET /ledger. Without an -addr argument it listens on 127.0.0.1 on a free
// port. The Proc's URL is http://127.0.0.1:PORT (the base for FetchLedger;
// sends go to URL+"/send").
func StartGateway(t testing.TB, args ...string) *Proc {
	t.Helper()
	bins := BuildBinaries(t)
	for i, a := range args {
		if a == "-addr" || a == "--addr" || strings.HasPrefix(a, "-addr=") || strings.HasPrefix(a, "--addr=") {
			addr := strings.TrimLeft(strings.TrimPrefix(strings.TrimPrefix(a, "--addr"), "-addr"), "=")
			if addr == "" && i+1 < len(args) {
				addr = args[i+1]
			}
			_, portStr, err := net.SplitHostPort(addr)
			if err != nil {
				t.Fatalf("proctest: StartGateway: bad -addr %q: %v", addr, err)
			}
			port, _ := strconv.Atoi(portStr)
			return Start(t, gatewaySpec(bins, port, args))
		}
	}
	return startOnPort(t, 0, func(port int) Spec {
		return gatewaySpec(bins, port, append([]string{"-addr", fmt.Sprintf("127.0.0.1:%d", port)}, args...))
	})
}

func gatewaySpec(bins Binaries, port int, args []string) Spec {
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	return Spec{
		Name:  "gateway",
		Path:  bins.Broadcast,
		Args:  append([]string{"gateway"}, args...),
		URL:   url,
		Port:  port,
		Ready: func(ctx context.Context) error { return getOK(ctx, url+"/ledger") },
	}
}

// startOnPort starts spec(port); with port 0 it picks free ports, trying
// again on another when the process fails to start.
func startOnPort(t testing.TB, port int, spec func(port int) Spec) *Proc {
	t.Helper()
	if port != 0 {
		return Start(t, spec(port))
	}
	var err error
	for range portAttempts {
		var p *Proc
		if p, err = start(t, spec(FreePort(t))); err == nil {
			return p
		}
	}
	t.Fatalf("proctest: %v", err)
	return nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proctest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// WaitForHTTP polls GET url until it answers 2xx, failing the test after
// ReadyTimeout.
func WaitForHTTP(t testing.TB, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ReadyTimeout)
	defer cancel()
	for {
		err := getOK(ctx, url)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("proctest: %s not answering 2xx after %s: %v", url, ReadyTimeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// getOK sends one GET and returns nil on a 2xx answer.
func getOK(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil
}
