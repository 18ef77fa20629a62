package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/broadcastd/broadcast/client"
)

// runControl sends pause, resume, cancel or retry-dead for a task.
func runControl(ctx context.Context, action string, args []string) error {
	fs := flag.NewFlagSet(action, flag.ExitOnError)
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: broadcast %s ID", action)
	}
	nc, err := connectNATS(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	reply, err := client.Control(cctx, nc, fs.Arg(0), action)
	if err != nil {
		return err
	}
	out, _ := json.Marshal(reply)
	fmt.Println(string(out))
	return nil
}

// runTasks lists tasks with their state and counts.
func runTasks(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tasks", flag.ExitOnError)
	asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
	_ = fs.Parse(args)
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	tasks, err := client.List(ctx, js)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, p := range tasks {
			_ = enc.Encode(p)
		}
		return nil
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TASK\tSTATE\tTOTAL\tSENT\tRETRYING\tFAILED\tSKIPPED\tEXPIRED\tCANCELLED\tRATE/S\tCREATED\tERROR")
	for _, p := range tasks {
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f\t%s\t%s\n", p.TaskID, p.State, p.Total, p.Sent, p.Retrying,
			p.Failed, p.Skipped, p.Expired, p.Cancelled, p.RatePerSec, p.CreatedAt.Local().Format(time.DateTime), shorten(p.Error, 60))
	}
	return w.Flush()
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
