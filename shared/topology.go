package shared

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/broadcastd/broadcast/contract"
)

// TopologyConfig tunes the server objects EnsureTopology creates.
type TopologyConfig struct {
	// Replicas for every stream, bucket and object store. Defaults to 1; use 3
	// on a three-node cluster.
	Replicas int
	// Retention is how long tasks, events, dead letters and ledger entries
	// are kept. Defaults to 30 days.
	Retention time.Duration
	// OnChange, when set, is told what EnsureTopology did to each stream,
	// bucket and object store (`broadcast setup` prints it).
	OnChange func(TopologyChange)
}

// TopologyChange is what EnsureTopology did to one stream, KV bucket or
// object store.
type TopologyChange struct {
	// Kind is "stream", "KV bucket" or "object store"; Name is its name.
	Kind, Name string
	// Action is "created", "updated" or "unchanged".
	Action string
	// Replicas is how many copies the server keeps now.
	Replicas int
}

func (c TopologyConfig) withDefaults() TopologyConfig {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Retention == 0 {
		c.Retention = 30 * 24 * time.Hour
	}
	return c
}

// LeaseTTL is the age at which an account's lease in KV broadcast_leases
// expires unless its owner refreshed it: after a crash, another dispatch
// process takes the account over within about this long.
const LeaseTTL = 5 * time.Second

// ReceiptRetention is how long receipts and the provider ids they are
// matched by are kept: providers report for up to 7 days (WhatsApp retries
// a webhook that long), with a day to spare.
const ReceiptRetention = 8 * 24 * time.Hour

// maxSuppressionValue bounds one suppression entry (a recipient of at most
// 256 bytes, a reason, a source, times and categories fit in far less).
const maxSuppressionValue = 2048

// KVStream is the name of the stream behind KV bucket bucket.
func KVStream(bucket string) string { return "KV_" + bucket }

// ObjectStream is the name of the stream behind object store bucket.
func ObjectStream(bucket string) string { return "OBJ_" + bucket }

// jobsMaxConsumers is JOBS's consumer limit: the lanes of 33,000 accounts,
// with room for the short-lived consumers that drain parked jobs.
const jobsMaxConsumers = 100_000

// Streams returns the definitions of every stream.
func Streams(c TopologyConfig) []jetstream.StreamConfig {
	c = c.withDefaults()
	// The server refuses a duplicate window longer than MaxAge (a test's
	// short Retention).
	dups := min(2*time.Minute, c.Retention)
	// A replicated stream's writes go to disk in batches already, and
	// the server refuses the async setting on one.
	indexPersist := jetstream.AsyncPersistMode
	if c.Replicas > 1 {
		indexPersist = jetstream.DefaultPersistMode
	}
	return []jetstream.StreamConfig{
		{
			Name:        contract.StreamTasks,
			Description: "Tasks submitted by users; kept for audit and replay.",
			// broadcast.start.<task> carries the scheduled start of tasks
			// with send_at (Nats-Schedule: @at), so nothing per recipient is
			// held until then.
			Subjects:          []string{contract.SubjectTasks, contract.SubjectStartPrefix + ">"},
			Retention:         jetstream.LimitsPolicy,
			MaxAge:            c.Retention,
			Duplicates:        dups,
			Storage:           jetstream.FileStorage,
			Replicas:          c.Replicas,
			AllowMsgSchedules: true,
		},
		{
			Name:        contract.StreamRender,
			Description: "Recipient batches from ingest waiting to be rendered.",
			Subjects:    []string{contract.SubjectRenderPrefix + ">"},
			Retention:   jetstream.WorkQueuePolicy,
			Duplicates:  dups,
			Storage:     jetstream.FileStorage,
			Replicas:    c.Replicas,
		},
		{
			Name:              contract.StreamJobs,
			Description:       "Rendered sends per account and priority, and jobs waiting out a delay.",
			Subjects:          []string{contract.SubjectJobsPrefix + ">", contract.SubjectDelayPrefix + ">", contract.SubjectParkedPrefix + ">"},
			Retention:         jetstream.WorkQueuePolicy,
			Duplicates:        dups,
			Storage:           jetstream.FileStorage,
			Replicas:          c.Replicas,
			AllowMsgSchedules: true,
			// Three consumers per account (its lanes): the server's default
			// of 1,000 per stream stopped dispatch at 333 accounts.
			MaxConsumers: jobsMaxConsumers,
		},
		{
			Name:        contract.StreamEvents,
			Description: "One event per outcome, folded by status into progress.",
			Subjects:    []string{contract.SubjectEventsPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      c.Retention,
			Duplicates:  dups,
			Storage:     jetstream.FileStorage,
			Replicas:    c.Replicas,
		},
		{
			Name:        contract.StreamDead,
			Description: "Recipients given up on, with their job and last error, for inspection and retry-dead.",
			Subjects:    []string{contract.SubjectDeadPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      c.Retention,
			Duplicates:  dups,
			Storage:     jetstream.FileStorage,
			Replicas:    c.Replicas,
		},
		{
			// status writes one entry per recipient outcome on the subject
			// of the recipient's hash, so a lookup reads one subject. On a
			// single node the server writes them to disk in batches (async
			// persist, up to about 10 ms late) instead of a system call
			// each. The index is a view of EVENTS that status writes
			// without waiting: if nats-server is killed it may miss the
			// entries of those last milliseconds, as it misses those still
			// on their way to it.
			Name:              contract.StreamLookup,
			Description:       "Outcomes indexed by recipient (hash of the normalized address) for lookups; personal data.",
			Subjects:          []string{contract.SubjectLookupPrefix + ">"},
			Retention:         jetstream.LimitsPolicy,
			MaxAge:            c.Retention,
			MaxMsgsPerSubject: contract.LookupKeptPerRecipient,
			Duplicates:        dups,
			Storage:           jetstream.FileStorage,
			Replicas:          c.Replicas,
			PersistMode:       indexPersist,
		},
		{
			// feedback stores every receipt here before it answers the
			// provider, so a crash of feedback loses none; its processor
			// turns them into events. Kept as long as the provider ids
			// they are matched by (ReceiptRetention).
			Name:        contract.StreamReceipts,
			Description: "Provider receipts (delivered, read, failed, bounces) accepted by feedback.",
			Subjects:    []string{contract.SubjectReceiptsPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      min(ReceiptRetention, c.Retention),
			Duplicates:  dups,
			Storage:     jetstream.FileStorage,
			Replicas:    c.Replicas,
		},
	}
}

// Buckets returns the definitions of every KV bucket.
func Buckets(c TopologyConfig) []jetstream.KeyValueConfig {
	c = c.withDefaults()
	return []jetstream.KeyValueConfig{
		{Bucket: contract.BucketProgress, Description: "Task progress, written by status.", History: 1, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: contract.BucketAccounts, Description: "Sender accounts; edits apply live.", History: 5, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: contract.BucketTasks, Description: "Accepted tasks: the record of seen task ids and the spec render reads.", History: 1, TTL: c.Retention, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// How render grouped each batch's jobs, kept as long as the jobs
		// may be queued (contract.Grouping).
		{Bucket: contract.BucketGroupings, Description: "How render laid each batch's jobs out in messages.", History: 1, TTL: c.Retention, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: contract.BucketLedger, Description: "Idempotency ledger per (task, recipient).", History: 1, TTL: c.Retention, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: contract.BucketControl, Description: "Task run state (paused, cancelled, awaiting approval, scheduled), written by ingest.", History: 1, TTL: c.Retention, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: contract.BucketHealth, Description: "Account health and effective rate, written by dispatch.", History: 1, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is <account>.<recipient hash> and lives 24 h after its last
		// send: the rolling window behind daily_cap and per_recipient_interval.
		{Bucket: contract.BucketSends, Description: "Rolling 24 h send log per account and recipient.", History: 1, TTL: 24 * time.Hour, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is an account; its value names the dispatch process that
		// sends for it. The owner refreshes it every second; one that stops
		// refreshing (a crash) loses it LeaseTTL after its last refresh.
		{Bucket: contract.BucketLeases, Description: "Which dispatch process sends for each account (short-lived leases).", History: 1, TTL: LeaseTTL, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is a sleeping account; its value the JOBS sequence after
		// which its jobs were never delivered (contract.BucketLanes).
		{Bucket: contract.BucketLanes, Description: "Asleep marks of sleeping accounts: the JOBS sequence through which their lanes held no job.", History: 1, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is a hash of a sent message's provider id (or of an email
		// recipient); feedback writes them from the sent events and matches
		// receipts by them for as long as providers report (ReceiptRetention).
		{Bucket: contract.BucketProviderIDs, Description: "Provider message ids of sent events, for matching receipts (feedback).", History: 1, TTL: ReceiptRetention, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is <scope>.<hex SHA-256 of the normalized recipient>
		// (scope: a channel or "all"); an entry stays until removed, so
		// there is no TTL. render and dispatch watch it (internal/suppress).
		{Bucket: contract.BucketSuppressions, Description: "Suppression list: recipients not to send to, per channel or all.", History: 1, MaxValueSize: maxSuppressionValue, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is an account; its value is what the provider last said
		// of it (quality rating, messaging limit). feedback writes it from
		// account webhooks, operators may too; dispatch and status watch it.
		{Bucket: contract.BucketSignals, Description: "Provider signals per account: quality rating and messaging limit.", History: 5, MaxValueSize: 4096, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is an account; its value is its health score over the
		// last hour, written by the status process that folds events.
		{Bucket: contract.BucketScores, Description: "Account health scores over the last hour, written by status.", History: 1, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Keys default and <channel>, each a contract.Policy; dispatch
		// watches it (internal/policy), so edits apply live.
		{Bucket: contract.BucketPolicy, Description: "Recipient policy: frequency caps and quiet hours, default and per channel.", History: 5, Storage: jetstream.FileStorage, Replicas: c.Replicas},
		// Each key is <channel>.<recipient hash>, its value the sends
		// reserved for that recipient under the frequency caps, changed by
		// compare-and-set; a key not written for the longest window a cap
		// may have is dropped.
		{Bucket: contract.BucketFrequency, Description: "Per-recipient send counts behind the frequency caps (internal).", History: 1, TTL: contract.MaxCapWindow, Storage: jetstream.FileStorage, Replicas: c.Replicas},
	}
}

// ObjectStores returns the definitions of every object store.
func ObjectStores(c TopologyConfig) []jetstream.ObjectStoreConfig {
	c = c.withDefaults()
	return []jetstream.ObjectStoreConfig{
		{Bucket: contract.BucketRecipients, Description: "Recipient lists (JSONL or CSV).", Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: contract.BucketStatus, Description: "Status checkpoints: per-recipient outcomes of each task.", Storage: jetstream.FileStorage, Replicas: c.Replicas},
	}
}

// EnsureTopology creates or updates every stream, KV bucket and object
// store. It is idempotent. `broadcast setup` (a privileged user) calls it
// before the services start, and so do the embedded dev, demo and bench
// modes and the test harnesses; the services themselves only check the
// topology (CheckTopology), so they need no grant to change it.
func EnsureTopology(ctx context.Context, js jetstream.JetStream, c TopologyConfig) error {
	for _, sc := range Streams(c) {
		apply := func() error {
			cur, err := streamInfo(ctx, js, sc.Name)
			if err != nil {
				return err
			}
			if sc.PersistMode, err = persistModeFor(sc, cur); err != nil {
				return err
			}
			_, err = js.CreateOrUpdateStream(ctx, sc)
			return err
		}
		if err := ensureOne(ctx, js, c, "stream", sc.Name, sc.Name, apply); err != nil {
			return err
		}
	}
	for _, kc := range Buckets(c) {
		apply := func() error { _, err := js.CreateOrUpdateKeyValue(ctx, kc); return err }
		if err := ensureOne(ctx, js, c, "KV bucket", kc.Bucket, KVStream(kc.Bucket), apply); err != nil {
			return err
		}
	}
	for _, oc := range ObjectStores(c) {
		apply := func() error { _, err := js.CreateOrUpdateObjectStore(ctx, oc); return err }
		if err := ensureOne(ctx, js, c, "object store", oc.Bucket, ObjectStream(oc.Bucket), apply); err != nil {
			return err
		}
	}
	return nil
}

// persistModeFor is the persist mode stream want gets when cur (nil: none)
// is the stream in place. The server cannot change a stream's persist mode,
// so an existing stream keeps its own, unless it is asynchronous and want
// is replicated, which the server refuses: then only removing the stream
// helps, and the error says so.
func persistModeFor(want jetstream.StreamConfig, cur *jetstream.StreamInfo) (jetstream.PersistModeType, error) {
	if cur == nil {
		return want.PersistMode, nil
	}
	if cur.Config.PersistMode == jetstream.AsyncPersistMode && want.Replicas > 1 {
		return 0, fmt.Errorf("it persists asynchronously, which a replicated stream cannot, and the server cannot change that in place: "+
			"remove it (`nats stream rm %s`; what it holds is lost) and run setup again", want.Name)
	}
	return cur.Config.PersistMode, nil
}

// ensureOne applies one object and, when c.OnChange is set, reports what
// changed by comparing its stream's configuration before and after.
func ensureOne(ctx context.Context, js jetstream.JetStream, c TopologyConfig, kind, name, stream string, apply func() error) error {
	var before *jetstream.StreamInfo
	if c.OnChange != nil {
		var err error
		if before, err = streamInfo(ctx, js, stream); err != nil {
			return fmt.Errorf("%s %s: %w", kind, name, err)
		}
	}
	if err := apply(); err != nil {
		return fmt.Errorf("%s %s: %w", kind, name, err)
	}
	if c.OnChange == nil {
		return nil
	}
	after, err := streamInfo(ctx, js, stream)
	if err == nil && after == nil {
		err = jetstream.ErrStreamNotFound
	}
	if err != nil {
		return fmt.Errorf("%s %s: reading it back: %w", kind, name, err)
	}
	ch := TopologyChange{Kind: kind, Name: name, Action: "unchanged", Replicas: after.Config.Replicas}
	switch {
	case before == nil:
		ch.Action = "created"
	case !reflect.DeepEqual(before.Config, after.Config):
		ch.Action = "updated"
	}
	c.OnChange(ch)
	return nil
}

// streamInfo returns a stream's info, or nil when it does not exist.
func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return st.CachedInfo(), nil
}
