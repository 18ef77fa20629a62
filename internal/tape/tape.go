// Package tape is the fault-replay tool's logic: it turns what the
// providers answered for a task, as its events and dead letters recorded
// it, into a gateway.Tape that internal/gateway plays back, so that an
// incident runs again against new code (`broadcast tape TASK`, then
// `broadcast gateway -tape FILE`, or a scenario with RunOptions.Tapes).
//
// Files: tape.go (this file) builds tapes and writes them as text.
package tape

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/gateway"
	"github.com/broadcastd/broadcast/internal/scenario"
)

// Record reads a task's events (stream EVENTS) and dead letters (stream
// DEAD) and builds its tape.
func Record(ctx context.Context, js jetstream.JetStream, task string) (*gateway.Tape, error) {
	evs, err := scenario.ReadEvents(ctx, js, task)
	if err != nil {
		return nil, err
	}
	dead, err := scenario.ReadDead(ctx, js, task)
	if err != nil {
		return nil, err
	}
	return Build(task, evs, dead), nil
}

// Build makes a tape from a task's events and dead letters: one answer per
// recipient and attempt that reached a provider (sent, retrying and failed
// events with a provider's code), in the order they were given, with the
// call's latency. A dead letter's history fills in attempts whose events
// are missing. Retry-After is not in events or dead letters, so 429s play
// back without it unless the tape is edited. Outcomes that never reached a
// provider (skipped, expired, cancelled, waits for caps or intervals) are
// left out.
func Build(task string, evs []contract.Event, dead []contract.DeadLetter) *gateway.Tape {
	t := &gateway.Tape{Task: task}
	seen := map[string]bool{}
	add := func(a gateway.TapeAnswer, at time.Time) {
		k := a.Key + "/" + strconv.Itoa(a.Attempt)
		if seen[k] {
			return
		}
		seen[k] = true
		a.Order = int(at.UnixNano()) // sorted below, then renumbered
		t.Answers = append(t.Answers, a)
	}
	for _, e := range evs {
		if e.JobID == "" || e.Attempt < 1 || e.Requeued {
			continue
		}
		var status int
		switch e.Kind {
		case contract.EventSent:
			status = 200
			if n, err := strconv.Atoi(e.Code); err == nil && n >= 200 && n < 300 {
				status = n
			}
		case contract.EventRetrying, contract.EventFailed:
			var ok bool
			if status, ok = providerStatus(e.Code); !ok {
				continue
			}
		default:
			continue
		}
		add(gateway.TapeAnswer{Key: e.JobID, To: e.To, Account: e.Account, Attempt: e.Attempt, Status: status,
			Code: e.Code, Kind: string(e.Kind), Latency: time.Duration(e.LatencyMS * float64(time.Millisecond))}, e.At)
	}
	for _, d := range dead {
		for _, h := range d.History {
			status, ok := providerStatus(h.Code)
			if !ok || h.Attempt < 1 {
				continue
			}
			add(gateway.TapeAnswer{Key: d.Job.ID, To: d.Job.To, Account: h.Account, Attempt: h.Attempt, Status: status,
				Code: h.Code, Kind: "dead"}, h.At)
		}
	}
	slices.SortStableFunc(t.Answers, func(a, b gateway.TapeAnswer) int { return a.Order - b.Order })
	for i := range t.Answers {
		t.Answers[i].Order = i + 1
	}
	return t
}

// providerStatus maps an outcome code to the HTTP status a gateway
// answered: the code itself when it is one, 0 for a timeout or a
// connection error; false for codes that are not a provider's answer.
func providerStatus(code string) (int, bool) {
	switch code {
	case "timeout", "network":
		return 0, true
	}
	n, err := strconv.Atoi(code)
	if err != nil || n < 100 || n > 599 {
		return 0, false
	}
	return n, true
}

// WriteText writes a tape as a table, one answer a line.
func WriteText(w io.Writer, t *gateway.Tape) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ORDER\tRECIPIENT\tKEY\tACCOUNT\tATTEMPT\tSTATUS\tCODE\tRETRY-AFTER\tLATENCY\tKIND\n")
	for _, a := range t.Answers {
		status, ra := strconv.Itoa(a.Status), "-"
		if a.Status == 0 {
			status = "none"
		}
		if a.RetryAfter > 0 {
			ra = a.RetryAfter.String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", a.Order, a.To, a.Key, a.Account, a.Attempt, status,
			a.Code, ra, a.Latency.Round(time.Millisecond/10), a.Kind)
	}
	counts := map[string]int{}
	for _, a := range t.Answers {
		counts[strconv.Itoa(a.Status)]++
	}
	var parts []string
	for k, v := range counts {
		if k == "0" {
			k = "none"
		}
		parts = append(parts, fmt.Sprintf("%s×%d", k, v))
	}
	slices.Sort(parts)
	fmt.Fprintf(tw, "\n%d answers for task %s: %s\n", len(t.Answers), t.Task, strings.Join(parts, " "))
	return tw.Flush()
}
