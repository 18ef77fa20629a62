package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// runSetup is `broadcast setup`: the one privileged step that creates or
// updates every stream, KV bucket and object store (shared.EnsureTopology),
// run as a user allowed to (auth.conf's admin) before the services, which
// only check the topology. Running it again changes only what differs. It
// writes what became of each object to out.
func runSetup(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("setup", flag.ExitOnError)
	replicas := fs.Int("replicas", 0, "replicas of every stream, bucket and object store (3 on a three-node cluster); default: as many as stream TASKS has, 1 for a new topology")
	wait := fs.Duration("wait", time.Minute, "how long to keep trying while the server starts (or a cluster forms)")
	keepRunning := fs.Bool("keep-running", false, "once done, keep running until stopped (a Procfile process: foreman stops every process when one exits)")
	_ = fs.Parse(args)
	if fs.NArg() != 0 || *replicas < 0 {
		return fmt.Errorf("usage: broadcast setup [-replicas N] [-wait D] [-keep-running]")
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	cfg := shared.NATSConfigFromEnv()
	wctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	nc, js, err := shared.ConnectJetStream(wctx, cfg, "setup", log)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	defer nc.Close()
	if *replicas == 0 {
		if *replicas, err = currentReplicas(wctx, js); err != nil {
			return fmt.Errorf("setup on %s: %w", cfg.URL, err)
		}
	}
	changes, err := setupTopology(wctx, nc, js, shared.TopologyConfig{Replicas: *replicas})
	if err != nil {
		return fmt.Errorf("setup on %s: %w", cfg.URL, err)
	}
	printChanges(out, changes)
	if *keepRunning {
		log.Info("setup done; running until stopped (-keep-running)")
		<-ctx.Done()
	}
	return nil
}

// setupTopology runs shared.EnsureTopology until it succeeds or ctx ends:
// right after a server or a cluster starts, JetStream may not accept new
// streams yet. A permissions violation ends it at once: the user may not
// change the topology. It returns what became of each object; a "created"
// or "updated" of an attempt that failed further on is kept over the
// "unchanged" of the next.
func setupTopology(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, topo shared.TopologyConfig) ([]shared.TopologyChange, error) {
	var (
		order []string
		seen  = map[string]shared.TopologyChange{}
	)
	topo.OnChange = func(c shared.TopologyChange) {
		key := c.Kind + " " + c.Name
		prev, ok := seen[key]
		if !ok {
			order = append(order, key)
		} else if c.Action == "unchanged" {
			c.Action = prev.Action
		}
		seen[key] = c
	}
	for {
		actx, cancel := context.WithTimeout(ctx, setupAttemptTimeout)
		err := shared.EnsureTopology(actx, js, topo)
		cancel()
		if err == nil {
			out := make([]shared.TopologyChange, 0, len(order))
			for _, k := range order {
				out = append(out, seen[k])
			}
			return out, nil
		}
		if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
			return nil, fmt.Errorf("%w (the user must be allowed to create streams: auth.conf's admin)", last)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// currentReplicas is how many replicas stream TASKS has, or 1 when it does
// not exist yet: setup without -replicas keeps a cluster's replicas.
func currentReplicas(ctx context.Context, js jetstream.JetStream) (int, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, setupAttemptTimeout)
		st, err := js.Stream(actx, contract.StreamTasks)
		cancel()
		switch {
		case err == nil:
			return st.CachedInfo().Config.Replicas, nil
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return 1, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("stream %s: %w", contract.StreamTasks, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setupAttemptTimeout bounds one attempt: a request the server refuses
// for lack of permission gets no answer, only an asynchronous error.
const setupAttemptTimeout = 5 * time.Second

// printChanges writes one line per object and a summary.
func printChanges(w io.Writer, changes []shared.TopologyChange) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	count := map[string]int{}
	for _, c := range changes {
		fmt.Fprintf(tw, "%s\t%s %s\treplicas %d\n", c.Action, c.Kind, c.Name, c.Replicas)
		count[c.Action]++
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "topology in place: %d created, %d updated, %d unchanged\n", count["created"], count["updated"], count["unchanged"])
}
