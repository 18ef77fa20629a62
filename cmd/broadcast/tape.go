package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/broadcastd/broadcast/internal/tape"
)

// runTape writes what the providers answered for a task (internal/tape):
// a table, or with -json the tape `broadcast gateway -tape` plays back.
func runTape(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tape", flag.ExitOnError)
	out := fs.String("o", "", "write to this file instead of stdout")
	asJSON := fs.Bool("json", false, "write the tape as JSON (what broadcast gateway -tape reads)")
	_ = fs.Parse(args)
	task := fs.Arg(0)
	if fs.NArg() > 1 {
		// Flags after the task id, as in "broadcast tape TASK -json".
		_ = fs.Parse(fs.Args()[1:])
		if fs.NArg() > 0 {
			task = ""
		}
	}
	if task == "" {
		return fmt.Errorf("usage: broadcast tape TASK [-o FILE] [-json]")
	}
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t, err := tape.Record(cctx, js, task)
	if err != nil {
		return err
	}
	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if *asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", " ")
		return enc.Encode(t)
	}
	return tape.WriteText(w, t)
}
