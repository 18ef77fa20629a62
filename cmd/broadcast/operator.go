package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/client"
	"github.com/broadcastd/broadcast/contract"
)

// The operator's view on the command line: what the dashboard's task,
// account and lookup pages show (docs/dashboard.md), each with -json.

const deadUsage = `usage:
  broadcast dead ls [-offset N] [-limit N] [-json] TASK    list a task's dead letters
  broadcast dead show [-json] TASK SEQ                     one dead letter with every attempt
  broadcast dead retry [-seqs 12,15] TASK                  re-queue all, or only those, dead letters`

// runOperatorCommand connects as the operator and runs dead, accounts or
// lookup.
func runOperatorCommand(ctx context.Context, cmd string, args []string) error {
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	return operatorCommand(ctx, js, cmd, args, os.Stdout)
}

// operatorCommand runs one of the operator's commands against js, writing
// to out.
func operatorCommand(ctx context.Context, js jetstream.JetStream, cmd string, args []string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch cmd {
	case "dead":
		return deadCommand(ctx, js, args, out)
	case "accounts":
		return accountsCommand(ctx, js, args, out)
	case "lookup":
		return lookupCommand(ctx, js, args, out)
	}
	return fmt.Errorf("unknown command %q", cmd)
}

func newFlags(name string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs, fs.Bool("json", false, "print JSON instead of a table")
}

func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func deadCommand(ctx context.Context, js jetstream.JetStream, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(deadUsage)
	}
	sub, args := args[0], args[1:]
	fs, asJSON := newFlags("dead " + sub)
	switch sub {
	case "ls":
		offset := fs.Int("offset", 0, "skip this many dead letters")
		limit := fs.Int("limit", 50, fmt.Sprintf("at most this many (up to %d)", client.MaxDeadPage))
		if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
			return fmt.Errorf("%v\n%s", errOr(err, "TASK: give one task id"), deadUsage)
		}
		page, err := client.DeadLetters(ctx, js, fs.Arg(0), *offset, *limit)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, page)
		}
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "SEQ\tTO\tACCOUNT\tATTEMPTS\tCODE\tERROR\tAT")
		for _, l := range page.Letters {
			fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", l.Seq, l.To, l.Account, len(l.Attempts), l.Code, shorten(l.Error, 60),
				l.At.Local().Format(time.DateTime))
		}
		fmt.Fprintf(w, "%d-%d of %d\n", min(page.Offset+1, page.Total), page.Offset+len(page.Letters), page.Total)
		return w.Flush()
	case "show":
		if err := fs.Parse(args); err != nil || fs.NArg() != 2 {
			return fmt.Errorf("%v\n%s", errOr(err, "TASK SEQ: give a task id and a dead letter's sequence"), deadUsage)
		}
		seq, err := strconv.ParseUint(fs.Arg(1), 10, 64)
		if err != nil {
			return fmt.Errorf("SEQ: %q is not a sequence number (see dead ls)", fs.Arg(1))
		}
		l, err := client.DeadLetter(ctx, js, fs.Arg(0), seq)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, l)
		}
		fmt.Fprintf(out, "dead letter %d of %s: %s via %s, given up %s\n", l.Seq, fs.Arg(0), l.To, l.Account, l.At.Local().Format(time.DateTime))
		for _, a := range l.Attempts {
			fmt.Fprintf(out, "  attempt %d  %s  %s  %s: %s\n", a.Attempt, a.At.Local().Format(time.DateTime), a.Account, a.Code, a.Error)
		}
		return nil
	case "retry":
		seqsFlag := fs.String("seqs", "", "comma-separated sequences (from dead ls) to re-queue; default all")
		if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
			return fmt.Errorf("%v\n%s", errOr(err, "TASK: give one task id"), deadUsage)
		}
		req := contract.ControlRequest{Action: contract.ActionRetryDead}
		for s := range strings.SplitSeq(*seqsFlag, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return fmt.Errorf("-seqs: %q is not a sequence number", s)
			}
			req.Seqs = append(req.Seqs, n)
		}
		reply, err := client.ControlRequest(ctx, js.Conn(), fs.Arg(0), req)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(out, reply)
		}
		fmt.Fprintf(out, "re-queued %d dead letters of %s\n", reply.Requeued, fs.Arg(0))
		return nil
	}
	return fmt.Errorf("dead: unknown subcommand %q\n%s", sub, deadUsage)
}

func errOr(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}

func accountsCommand(ctx context.Context, js jetstream.JetStream, args []string, out io.Writer) error {
	fs, asJSON := newFlags("accounts")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return fmt.Errorf("%v\nusage: broadcast accounts [-json]", errOr(err, "accounts takes no arguments"))
	}
	accounts, err := client.Accounts(ctx, js)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, accounts)
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ACCOUNT\tCHANNEL\tENABLED\tHEALTH\tRATE/S\tCEILING/S\tDAILY USED\tDAILY CAP\tQUALITY\tSCORE\tREASON")
	for _, a := range accounts {
		daily := "-"
		if a.DailyCap > 0 {
			daily = strconv.Itoa(a.DailyCap)
		}
		reason := a.Reason
		if a.Invalid != "" {
			reason = "invalid: " + a.Invalid
		} else if reason == "" {
			reason = a.QualityReason
		}
		score := "-"
		if a.Score >= 0 {
			score = strconv.Itoa(a.Score)
		}
		fmt.Fprintf(w, "%s\t%s\t%t\t%s\t%.1f\t%.1f\t%d\t%s\t%s\t%s\t%s\n", a.Name, a.Channel, a.Enabled, a.State, a.RatePerSec, a.Ceiling,
			a.DailyUsed, daily, a.Quality, score, shorten(reason, 60))
	}
	return w.Flush()
}

func lookupCommand(ctx context.Context, js jetstream.JetStream, args []string, out io.Writer) error {
	fs, asJSON := newFlags("lookup")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return fmt.Errorf("%v\nusage: broadcast lookup [-json] RECIPIENT", errOr(err, "RECIPIENT: give one recipient"))
	}
	found, err := client.LookupRecipient(ctx, js, fs.Arg(0))
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, found)
	}
	fmt.Fprintf(out, "%d outcomes for %s\n", len(found.Entries), found.Normalized)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "AT\tTASK\tOUTCOME\tACCOUNT\tATTEMPT\tCODE\tERROR")
	for _, e := range found.Entries {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.At.Local().Format(time.DateTime), e.TaskID, e.Kind, e.Account, e.Attempt,
			e.Code, shorten(e.Error, 60))
	}
	return w.Flush()
}
