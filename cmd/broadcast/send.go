package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// connectNATS connects the CLI to NATS_URL, failing after 10 s.
func connectNATS(ctx context.Context) (*nats.Conn, error) {
	log, err := newLogger()
	if err != nil {
		return nil, err
	}
	nc, err := shared.Connect(shared.NATSConfigFromEnv(), "cli", log)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := shared.WaitConnected(wctx, nc); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

func connectJS(ctx context.Context) (func(), jetstream.JetStream, error) {
	nc, err := connectNATS(ctx)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc.Close, js, nil
}

func runSend(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	noWait := fs.Bool("no-wait", false, "publish and return without following progress")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: broadcast send FILE (- for stdin)")
	}
	var data []byte
	var err error
	if fs.Arg(0) == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(fs.Arg(0))
	}
	if err != nil {
		return err
	}
	// Check locally first so obvious mistakes are reported here, naming the
	// field; ingest checks again (and also what needs configuration).
	task, err := contract.DecodeTask(data)
	if err == nil {
		task.Normalize()
		if task.ID == "" {
			return fmt.Errorf("id: set an id so the task can be followed (ingest would assign a ULID)")
		}
		err = task.Validate(time.Now())
	}
	if err != nil {
		return fmt.Errorf("invalid task: %w", err)
	}
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	id, err := client.Submit(ctx, js, data)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "published task %s\n", id)
	if *noWait {
		return nil
	}
	return follow(ctx, js, id)
}

func runWatch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("watch", flag.ExitOnError)
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: broadcast watch ID")
	}
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	return follow(ctx, js, fs.Arg(0))
}

// follow draws a progress bar until the task is final, then prints its
// progress JSON. The exit status is 0 for succeeded or partial, 1 otherwise.
func follow(ctx context.Context, js jetstream.JetStream, id string) error {
	bar := newProgressBar(id)
	p, err := client.Follow(ctx, js, id, bar.update)
	bar.finish()
	if err != nil {
		return err
	}
	out, _ := json.MarshalIndent(p, "", "  ")
	fmt.Println(string(out))
	if p.State != contract.StateSucceeded && p.State != contract.StatePartial {
		return exitCode(1)
	}
	return nil
}
