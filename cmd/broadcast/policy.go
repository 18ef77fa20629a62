package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/channels"
	"github.com/broadcastd/broadcast/contract"
)

const policyUsage = `usage:
  broadcast policy get [-json] [KEY]    the value stored under KEY (default: default)
  broadcast policy set KEY JSON|-       validate a policy, then store it under KEY (default or a channel)
  broadcast policy rm KEY               remove KEY's policy
  broadcast policy ls [-json]           every key with a one-line summary
  broadcast policy check JSON|-         validate a policy without storing it
JSON is the value itself; - reads it from stdin.`

// runPolicy manages the recipient policy (KV broadcast_policy) as the
// operator user, like the suppress command.
func runPolicy(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(policyUsage)
	}
	if args[0] == "check" {
		// Validating needs no server.
		return policyCommand(ctx, nil, args, os.Stdin, os.Stdout)
	}
	closeNC, js, err := connectJS(ctx)
	if err != nil {
		return err
	}
	defer closeNC()
	return policyCommand(ctx, js, args, os.Stdin, os.Stdout)
}

// storedPolicy is a key of KV broadcast_policy as get -json and ls -json
// print it: the value as stored, and what dispatch makes of it (Error
// set: it does not validate and dispatch treats it as absent; Unused: the
// key is neither default nor a channel, so dispatch never reads it).
type storedPolicy struct {
	Key      string          `json:"key"`
	Value    json.RawMessage `json:"value"`
	Revision uint64          `json:"revision,omitempty"`
	Updated  time.Time       `json:"updated,omitzero"`
	Summary  string          `json:"summary,omitempty"`
	Error    string          `json:"error,omitempty"`
	Unused   bool            `json:"unused,omitempty"`
}

// policyCommand runs one policy subcommand against js (nil for check),
// reading a "-" value from in and writing to out.
func policyCommand(ctx context.Context, js jetstream.JetStream, args []string, in io.Reader, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(policyUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sub, args := args[0], args[1:]
	fs, asJSON := newFlags("policy " + sub)
	usageErr := func(err error, msg string) error {
		return fmt.Errorf("policy %s: %v\n%s", sub, errOr(err, msg), policyUsage)
	}
	switch sub {
	case "check":
		if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
			return usageErr(err, "give the value (or - for stdin)")
		}
		_, p, err := readPolicyValue(fs.Arg(0), in)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "valid:", summarizePolicy(p))
		return nil
	case "set":
		if err := fs.Parse(args); err != nil || fs.NArg() != 2 {
			return usageErr(err, "give KEY and the value (or - for stdin)")
		}
		key := fs.Arg(0)
		if err := checkPolicyKey(key); err != nil {
			return err
		}
		value, p, err := readPolicyValue(fs.Arg(1), in)
		if err != nil {
			return fmt.Errorf("%w (nothing stored)", err)
		}
		kv, err := policyBucket(ctx, js)
		if err != nil {
			return err
		}
		rev, err := kv.Put(ctx, key, value)
		if err != nil {
			return fmt.Errorf("policy set %s: %w", key, err)
		}
		fmt.Fprintf(out, "stored %s (revision %d): %s\n", key, rev, summarizePolicy(p))
		return nil
	case "get":
		if err := fs.Parse(args); err != nil || fs.NArg() > 1 {
			return usageErr(err, "give at most one KEY")
		}
		key := contract.PolicyDefault
		if fs.NArg() == 1 {
			key = fs.Arg(0)
		}
		kv, err := policyBucket(ctx, js)
		if err != nil {
			return err
		}
		sp, err := getPolicy(ctx, kv, key)
		if err != nil {
			return err
		}
		if *asJSON {
			if sp == nil {
				sp = &storedPolicy{Key: key, Value: json.RawMessage("null")}
			}
			return printJSON(out, sp)
		}
		if sp == nil {
			fmt.Fprintf(out, "no policy is stored under %s: %s\n", key, absentMeans(key))
			return nil
		}
		var pretty bytes.Buffer
		if json.Indent(&pretty, sp.Value, "", "  ") != nil {
			pretty.Reset()
			pretty.Write(sp.Value)
		}
		fmt.Fprintln(out, pretty.String())
		if note := policyNote(sp); note != "" {
			fmt.Fprintln(out, "# "+note)
		}
		return nil
	case "rm":
		if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
			return usageErr(err, "give one KEY")
		}
		key := fs.Arg(0)
		kv, err := policyBucket(ctx, js)
		if err != nil {
			return err
		}
		// A key is looked up first so a typo is reported, not deleted
		// silently; any stored key can be removed, also one that is no
		// channel (written with nats kv put).
		sp, err := getPolicy(ctx, kv, key)
		if err != nil {
			return err
		}
		if sp == nil {
			return fmt.Errorf("policy rm: no policy is stored under %s", key)
		}
		if err := kv.Delete(ctx, key); err != nil {
			return fmt.Errorf("policy rm %s: %w", key, err)
		}
		fmt.Fprintf(out, "removed %s: %s\n", key, absentMeans(key))
		return nil
	case "ls":
		if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
			return usageErr(err, "ls takes no arguments")
		}
		kv, err := policyBucket(ctx, js)
		if err != nil {
			return err
		}
		return listPolicies(ctx, kv, *asJSON, out)
	}
	return fmt.Errorf("policy: unknown subcommand %q\n%s", sub, policyUsage)
}

func policyBucket(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, contract.BucketPolicy)
	if err != nil {
		return nil, fmt.Errorf("%s bucket: %w (run broadcast setup)", contract.BucketPolicy, err)
	}
	return kv, nil
}

// policyChannels names the channels this build knows, the keys besides
// default that dispatch reads.
var policyChannels = channels.Builtin().Names()

// checkPolicyKey accepts the keys dispatch reads: default and the
// channels' names. Any other key would be stored and never applied.
func checkPolicyKey(key string) error {
	if key == contract.PolicyDefault || slices.Contains(policyChannels, key) {
		return nil
	}
	return fmt.Errorf("key: %q is neither %q nor a channel (%s)", key, contract.PolicyDefault, strings.Join(policyChannels, ", "))
}

// readPolicyValue reads a value given on the command line, or from in
// for "-", and validates it with contract.DecodePolicy (the errors name
// the field). The value is returned compacted, as it will be stored.
func readPolicyValue(arg string, in io.Reader) ([]byte, *contract.Policy, error) {
	raw := []byte(arg)
	if arg == "-" {
		var err error
		if raw, err = io.ReadAll(io.LimitReader(in, maxPolicyValue+1)); err != nil {
			return nil, nil, fmt.Errorf("policy: stdin: %w", err)
		}
		if len(raw) > maxPolicyValue {
			return nil, nil, fmt.Errorf("policy: the value is over %d bytes", maxPolicyValue)
		}
	}
	p, err := contract.DecodePolicy(raw)
	if err != nil {
		return nil, nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	return compact.Bytes(), p, nil
}

// maxPolicyValue bounds a value read from stdin; a real policy is a few
// hundred bytes.
const maxPolicyValue = 64 << 10

// getPolicy reads key, nil when none is stored.
func getPolicy(ctx context.Context, kv jetstream.KeyValue, key string) (*storedPolicy, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", key, err)
	}
	return describePolicy(e), nil
}

// describePolicy is a stored entry with what dispatch makes of it.
func describePolicy(e jetstream.KeyValueEntry) *storedPolicy {
	sp := &storedPolicy{Key: e.Key(), Value: e.Value(), Revision: e.Revision(), Updated: e.Created().UTC()}
	if !json.Valid(sp.Value) {
		// Kept printable in -json output.
		sp.Value, _ = json.Marshal(string(e.Value()))
	}
	if p, err := contract.DecodePolicy(e.Value()); err != nil {
		sp.Error = err.Error()
	} else {
		sp.Summary = summarizePolicy(p)
	}
	sp.Unused = checkPolicyKey(sp.Key) != nil
	return sp
}

// policyNote says why a stored value has no effect, if it has none.
func policyNote(sp *storedPolicy) string {
	switch {
	case sp.Unused:
		return fmt.Sprintf("not applied: %s is neither %s nor a channel (%s)", sp.Key, contract.PolicyDefault, strings.Join(policyChannels, ", "))
	case sp.Error != "":
		return "not applied, dispatch treats it as absent: " + sp.Error
	}
	return ""
}

// absentMeans says which policy applies where key has none.
func absentMeans(key string) string {
	if key == contract.PolicyDefault {
		return "channels without their own key have no policy"
	}
	return "the default applies to this channel"
}

// summarizePolicy is a policy on one line: its caps and quiet hours.
func summarizePolicy(p *contract.Policy) string {
	var parts []string
	if len(p.FrequencyCaps) > 0 {
		caps := make([]string, len(p.FrequencyCaps))
		for i := range p.FrequencyCaps {
			caps[i] = p.FrequencyCaps[i].Describe()
		}
		parts = append(parts, "caps "+strings.Join(caps, "; "))
	} else {
		parts = append(parts, "no caps")
	}
	if q := p.QuietHours; q != nil {
		s := fmt.Sprintf("quiet %s-%s default_tz %s", q.Start, q.End, q.DefaultLocation())
		if len(q.Categories) > 0 {
			cats := make([]string, len(q.Categories))
			for i, c := range q.Categories {
				cats[i] = string(c)
			}
			s += " for " + strings.Join(cats, ",")
		}
		parts = append(parts, s)
	} else {
		parts = append(parts, "no quiet hours")
	}
	return strings.Join(parts, ", ")
}

// listPolicies prints every key, sorted, with its summary (or why it is
// not applied): a table, or JSON lines.
func listPolicies(ctx context.Context, kv jetstream.KeyValue, asJSON bool, out io.Writer) error {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("policy ls: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var all []*storedPolicy
	for _, k := range keys {
		sp, err := getPolicy(ctx, kv, k)
		if err != nil {
			return err
		}
		if sp != nil { // deleted since it was listed
			all = append(all, sp)
		}
	}
	if asJSON {
		enc := json.NewEncoder(out)
		for _, sp := range all {
			if err := enc.Encode(sp); err != nil {
				return err
			}
		}
		return nil
	}
	if len(all) == 0 {
		fmt.Fprintln(out, "no policy is stored: no caps, no quiet hours")
		return nil
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tREVISION\tUPDATED\tPOLICY")
	for _, sp := range all {
		line := sp.Summary
		if note := policyNote(sp); note != "" {
			line = note
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", sp.Key, sp.Revision, sp.Updated.Format(time.RFC3339), line)
	}
	return w.Flush()
}
