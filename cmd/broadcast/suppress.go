package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/suppress"
)

const suppressUsage = `usage:
  broadcast suppress add (-channel C | -all) -reason R [-categories a,b] [-until RFC3339] TO
  broadcast suppress remove (-channel C | -all) TO
  broadcast suppress list [-json]
  broadcast suppress import [-source S] FILE   (CSV with a header to,reason[,scope][,categories][,until], or JSONL)`

// runSuppress manages the suppression list (KV broadcast_suppressions) as
// the operator user, like the other admin commands.
func runSuppress(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(suppressUsage)
	}
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	return suppressCommand(ctx, js, args, os.Stdout)
}

// suppressCommand runs one suppress subcommand against js, writing to out.
func suppressCommand(ctx context.Context, js jetstream.JetStream, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(suppressUsage)
	}
	list, err := suppress.Open(ctx, js)
	if err != nil {
		return err
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("suppress "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	channel := fs.String("channel", "", "the channel whose entry it is")
	all := fs.Bool("all", false, "the entry applies to every channel (scope all)")
	switch sub {
	case "add":
		reason := fs.String("reason", "", "why: "+strings.Join(contract.Reasons, ", "))
		cats := fs.String("categories", "", "comma-separated categories it suppresses (default: all)")
		until := fs.String("until", "", "RFC 3339 time after which it no longer suppresses (default: never)")
		if err := parseSuppressFlags(fs, args); err != nil {
			return err
		}
		scope, err := scopeFlag(*channel, *all)
		if err != nil {
			return err
		}
		e := contract.Suppression{To: fs.Arg(0), Reason: *reason, Source: "cli"}
		if err := fillEntry(&e, *cats, *until); err != nil {
			return err
		}
		key, err := list.Put(ctx, scope, e)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "added", key)
		return nil
	case "remove":
		if err := parseSuppressFlags(fs, args); err != nil {
			return err
		}
		scope, err := scopeFlag(*channel, *all)
		if err != nil {
			return err
		}
		key, err := list.Remove(ctx, scope, fs.Arg(0))
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "removed", key)
		return nil
	case "list":
		asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
		if err := fs.Parse(args); err != nil {
			return fmt.Errorf("suppress list: %w", err)
		}
		return listSuppressions(ctx, list, *asJSON, out)
	case "import":
		source := fs.String("source", "import", "the source recorded on each entry")
		if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
			return fmt.Errorf("usage: broadcast suppress import [-channel C | -all] [-source S] FILE")
		}
		def := ""
		if *channel != "" || *all {
			if def, err = scopeFlag(*channel, *all); err != nil {
				return err
			}
		}
		return importSuppressions(ctx, list, fs.Arg(0), def, *source, out)
	}
	return fmt.Errorf("suppress: unknown subcommand %q\n%s", sub, suppressUsage)
}

func parseSuppressFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("suppress %s: %w\n%s", strings.TrimPrefix(fs.Name(), "suppress "), err, suppressUsage)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("suppress %s: want exactly one recipient after the flags\n%s", strings.TrimPrefix(fs.Name(), "suppress "), suppressUsage)
	}
	return nil
}

func scopeFlag(channel string, all bool) (string, error) {
	switch {
	case all && channel != "":
		return "", errors.New("-channel, -all: give one, not both")
	case all:
		return contract.ScopeAll, nil
	case channel == "":
		return "", errors.New("-channel: required (or -all)")
	}
	return channel, nil
}

// fillEntry checks e's reason against the known ones (a typo would make
// a reason nobody filters on) and parses the categories list and until
// into e.
func fillEntry(e *contract.Suppression, cats, until string) error {
	if !slices.Contains(contract.Reasons, e.Reason) {
		return fmt.Errorf("reason: want one of %s, got %q", strings.Join(contract.Reasons, ", "), e.Reason)
	}
	for c := range strings.SplitSeq(cats, ",") {
		if c = strings.TrimSpace(c); c != "" {
			e.Categories = append(e.Categories, contract.Category(c))
		}
	}
	if until = strings.TrimSpace(until); until != "" {
		t, err := time.Parse(time.RFC3339, until)
		if err != nil {
			return fmt.Errorf("until: want an RFC 3339 time like 2026-12-02T09:00:00Z, got %q", until)
		}
		t = t.UTC()
		e.Until = &t
	}
	return nil
}

func listSuppressions(ctx context.Context, list *suppress.List, asJSON bool, out io.Writer) error {
	if asJSON {
		enc := json.NewEncoder(out)
		return list.All(ctx, func(s suppress.Stored) error { return enc.Encode(s) })
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SCOPE\tTO\tREASON\tCATEGORIES\tSOURCE\tAT\tUNTIL")
	err := list.All(ctx, func(s suppress.Stored) error {
		cats := "all"
		if len(s.Categories) > 0 {
			var names []string
			for _, c := range s.Categories {
				names = append(names, string(c))
			}
			cats = strings.Join(names, ",")
		}
		until := "-"
		if s.Until != nil {
			until = s.Until.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Scope, s.To, s.Reason, cats, s.Source, s.At.Format(time.RFC3339), until)
		return nil
	})
	if err != nil {
		return err
	}
	return w.Flush()
}

// importRow is one line of a JSONL import: an entry plus its scope.
type importRow struct {
	Scope      string   `json:"scope"`
	To         string   `json:"to"`
	Reason     string   `json:"reason"`
	Categories []string `json:"categories"`
	Until      string   `json:"until"`
	Source     string   `json:"source"`
}

// maxImportLine bounds one line of an import file.
const maxImportLine = 64 << 10

// importSuppressions adds every entry of path: JSONL (each line an object
// with to, reason, scope and optional categories, until, source) or CSV
// with a header naming at least to and reason (and optionally scope,
// categories separated by ";" or "|", until). defScope is used where a
// row has no scope. It stops at the first bad row, naming its line and
// field; rows before it are added.
func importSuppressions(ctx context.Context, list *suppress.List, path, defScope, source string, out io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, maxImportLine)
	head, _ := br.Peek(1)
	n := 0
	add := func(line int, r importRow) error {
		scope := r.Scope
		if scope == "" {
			scope = defScope
		}
		if scope == "" {
			return fmt.Errorf("line %d: scope: required (a column, or -channel / -all)", line)
		}
		e := contract.Suppression{To: r.To, Reason: r.Reason, Source: source}
		if r.Source != "" {
			e.Source = r.Source
		}
		if err := fillEntry(&e, strings.Join(r.Categories, ","), r.Until); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		if _, err := list.Put(ctx, scope, e); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		n++
		return nil
	}
	if len(head) == 1 && head[0] == '{' {
		sc := bufio.NewScanner(br)
		sc.Buffer(make([]byte, 0, 4096), maxImportLine)
		for line := 1; sc.Scan(); line++ {
			raw := bytes.TrimSpace(sc.Bytes())
			if len(raw) == 0 {
				continue
			}
			var r importRow
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&r); err != nil {
				return fmt.Errorf("line %d: %v (after %d added)", line, err, n)
			}
			if err := add(line, r); err != nil {
				return fmt.Errorf("%w (after %d added)", err, n)
			}
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("%s: %w (after %d added)", path, err, n)
		}
	} else {
		cr := csv.NewReader(br)
		cr.FieldsPerRecord = -1
		header, err := cr.Read()
		if err != nil {
			return fmt.Errorf("%s: header: %w", path, err)
		}
		col := map[string]int{}
		for i, h := range header {
			col[strings.ToLower(strings.TrimSpace(h))] = i
		}
		for _, need := range []string{"to", "reason"} {
			if _, ok := col[need]; !ok {
				return fmt.Errorf("%s: header: column %q is required (to,reason[,scope][,categories][,until])", path, need)
			}
		}
		get := func(rec []string, name string) string {
			if i, ok := col[name]; ok && i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		for line := 2; ; line++ {
			rec, err := cr.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w (after %d added)", path, err, n)
			}
			r := importRow{Scope: get(rec, "scope"), To: get(rec, "to"), Reason: get(rec, "reason"), Until: get(rec, "until"), Source: get(rec, "source")}
			if c := get(rec, "categories"); c != "" {
				r.Categories = slices.DeleteFunc(strings.FieldsFunc(c, func(r rune) bool { return r == ';' || r == '|' || r == ',' }),
					func(s string) bool { return strings.TrimSpace(s) == "" })
			}
			if err := add(line, r); err != nil {
				return fmt.Errorf("%w (after %d added)", err, n)
			}
		}
	}
	fmt.Fprintf(out, "imported %d entries\n", n)
	return nil
}
