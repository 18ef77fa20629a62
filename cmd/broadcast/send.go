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
	receipts := fs.Duration("receipts", 0, "after the task is final, keep showing the providers' receipts (delivered, read, undelivered) this long")
	lines := fs.Bool("lines", false, "print a line a second (sent, failed, skipped per second, retrying, rate) instead of a bar")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: broadcast watch [-receipts 10m] [-lines] ID")
	}
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	if *lines {
		return followWith(ctx, js, fs.Arg(0), *receipts, newWatchLines(os.Stdout, time.Second).update, func() {})
	}
	return followFor(ctx, js, fs.Arg(0), *receipts)
}

// follow draws a progress bar until the task is final, then prints its
// progress JSON. The exit status is 0 for succeeded or partial, 1 otherwise.
func follow(ctx context.Context, js jetstream.JetStream, id string) error {
	return followFor(ctx, js, id, 0)
}

// followFor is follow that, with receipts above 0, keeps reading the
// final task's progress that long and prints a line whenever the
// providers' receipts change its counts (they come after the sends).
func followFor(ctx context.Context, js jetstream.JetStream, id string, receipts time.Duration) error {
	bar := newProgressBar(id)
	return followWith(ctx, js, id, receipts, bar.update, bar.finish)
}

// followWith is followFor showing progress with show, and calling done
// once the task is final.
func followWith(ctx context.Context, js jetstream.JetStream, id string, receipts time.Duration, show func(*contract.Progress), done func()) error {
	p, err := client.Follow(ctx, js, id, show)
	done()
	if err != nil {
		return err
	}
	if receipts > 0 {
		p = followReceipts(ctx, js, p, receipts)
	}
	out, _ := json.MarshalIndent(p, "", "  ")
	fmt.Println(string(out))
	if p.State != contract.StateSucceeded && p.State != contract.StatePartial {
		return exitCode(1)
	}
	return nil
}

// followReceipts polls p's task for d (or until ctx ends), printing its
// receipt counts whenever they change, and returns the last progress read.
func followReceipts(ctx context.Context, js jetstream.JetStream, p *contract.Progress, d time.Duration) *contract.Progress {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	show := func(p *contract.Progress) {
		fmt.Fprintf(os.Stderr, "%s %s receipts: delivered %d read %d undelivered %d of %d sent\n",
			time.Now().Format(time.TimeOnly), p.TaskID, p.Delivered, p.Read, p.Undelivered, p.Sent)
	}
	show(p)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return p
		case <-tick.C:
		}
		q, err := client.Get(ctx, js, p.TaskID)
		if err != nil {
			continue
		}
		if q.Delivered != p.Delivered || q.Read != p.Read || q.Undelivered != p.Undelivered {
			show(q)
		}
		p = q
	}
}
