package permissions

import (
	"slices"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// User is one user of the servers' configuration and what it may do.
type User struct {
	// Name is the user name (NATS_USER).
	Name string
	// About says who connects as this user and what for.
	About string
	// PasswordHash is the bcrypt hash (cost 6) of the user's development
	// password, which the Procfile or .env holds.
	PasswordHash string
	// Publish and Subscribe allow and deny subjects; a deny wins over an
	// allow.
	Publish, Subscribe Rules
	// AllowResponses lets the user answer the requests it receives without
	// publish rights on _INBOX.>.
	AllowResponses bool
}

// Rules are the subjects allowed and denied for publishing or subscribing.
type Rules struct {
	Allow, Deny []Grant
}

// serviceDurables are the services' durable consumers: each is read by
// its service only.
var serviceDurables = []struct{ stream, name string }{
	{contract.StreamTasks, contract.ConsumerIngest},
	{contract.StreamTasks, contract.ConsumerIngestStart},
	{contract.StreamRender, contract.ConsumerRender},
	{contract.StreamEvents, contract.ConsumerStatus},
	{contract.StreamEvents, contract.ConsumerFeedbackIndex},
	{contract.StreamEvents, contract.ConsumerFeedbackWxPusher},
	{contract.StreamReceipts, contract.ConsumerFeedback},
}

// othersDurables is durableTouch for the services' durables on streams,
// but own.
func othersDurables(own string, streams ...string) []string {
	var out []string
	for _, d := range serviceDurables {
		if slices.Contains(streams, d.stream) && d.name != own {
			out = append(out, durableTouch(d.stream, d.name)...)
		}
	}
	return out
}

// Users returns every user, in the order auth.conf lists them: one per
// service, the operator (people and the nats CLI), the read-only viewer
// and admin, which runs `broadcast setup`.
func Users() []User {
	return []User{ingestUser(), renderUser(), dispatchUser(), statusUser(), feedbackUser(), operatorUser(), viewerUser(), adminUser()}
}

// checkTopology lets a service check the topology at start
// (shared.CheckTopology) and open its buckets: stream info only.
func checkTopology() Grant {
	return grant("checking the topology at start: stream info only (`broadcast setup` creates it)", each(allStreams(), streamInfo))
}

// flowControl answers the flow control of push consumers (KV watches,
// object reads).
func flowControl() Grant { return grant("flow control of its KV watches", subjects("$JS.FC.>")) }

// inbox receives the replies to the client's own requests.
func inbox(more ...string) Rules {
	return Rules{Allow: []Grant{grant("replies to its requests", subjects("_INBOX.>"), more)}}
}

func ingestUser() User {
	return User{
		Name: "ingest",
		About: "ingest: reads TASKS, records tasks, publishes render batches, accepted/rejected events and " +
			"scheduled starts; serves broadcast.control.<task>.",
		PasswordHash: "$2a$06$CTDdiPduOm20S4oOYCYtdecywjaMCWnqO/J4Q8WJEFWKXMQwfJEnu",
		Publish: Rules{
			Allow: []Grant{
				checkTopology(),
				grant("its own subjects", subjects(contract.SubjectRenderPrefix+">", contract.SubjectEventsPrefix+">",
					contract.SubjectStartPrefix+">", contract.SubjectRequeuePrefix+"*")),
				grant("its KV buckets (write) and the buckets it reads",
					kvWrite(contract.BucketTasks), kvWrite(contract.BucketControl),
					each([]string{contract.BucketTasks, contract.BucketControl, contract.BucketAccounts, contract.BucketProgress}, kvRead)),
				grant("its consumers on TASKS, and reading a submission back",
					durable(contract.StreamTasks, contract.ConsumerIngest), durable(contract.StreamTasks, contract.ConsumerIngestStart),
					subjects("$JS.API.STREAM.MSG.GET."+contract.StreamTasks)),
				grant("recipient lists (read)", objectRead(contract.BucketRecipients)),
				flowControl(),
			},
			Deny: []Grant{grant("what only others publish", subjects(contract.SubjectTasks, contract.SubjectJobsPrefix+">",
				contract.SubjectDeadPrefix+">", contract.SubjectDelayPrefix+">", contract.SubjectParkedPrefix+">"))},
		},
		Subscribe:      inbox(contract.SubjectControlPrefix + "*"),
		AllowResponses: true,
	}
}

func renderUser() User {
	return User{
		Name:         "render",
		About:        "render: reads RENDER, publishes jobs and skipped events, records how it grouped each batch's jobs, names their accounts ahead (wake notices).",
		PasswordHash: "$2a$06$jZT9SWW1GRtiKSemj2n5Ae732Z7g9FI/1itk7ELOxC3ptf4..QvHq",
		Publish: Rules{
			Allow: []Grant{
				checkTopology(),
				grant("its own subjects", subjects(contract.SubjectJobsPrefix+">", contract.SubjectEventsPrefix+">")),
				grant("naming the accounts of a batch's jobs before storing them, so dispatch wakes them", subjects(contract.SubjectWake)),
				grant("batches it gives up on, kept for inspection", subjects(contract.SubjectDeadPrefix+">")),
				grant("the buckets it reads", each([]string{contract.BucketTasks, contract.BucketAccounts, contract.BucketHealth,
					contract.BucketSuppressions, contract.BucketGroupings}, kvRead)),
				grant("loading the suppression list in batches before watching it", kvSnapshot(contract.BucketSuppressions)),
				grant("how it grouped each batch's jobs", each([]string{contract.BucketGroupings}, kvWrite)),
				grant("its consumer on RENDER", durable(contract.StreamRender, contract.ConsumerRender)),
				flowControl(),
			},
			Deny: []Grant{grant("what only others publish", subjects(contract.SubjectTasks, contract.SubjectRenderPrefix+">",
				contract.SubjectControlPrefix+">"))},
		},
		Subscribe: inbox(),
	}
}

func dispatchUser() User {
	jobs, dead, events := contract.StreamJobs, contract.StreamDead, contract.StreamEvents
	return User{
		Name: "dispatch",
		About: "dispatch: reads JOBS per account, sends, publishes events, dead letters, delayed and parked " +
			"jobs; re-queues parked and dead jobs on request from ingest.",
		PasswordHash: "$2a$06$LxR1n0B0PY55WY6Gj/ZVp.5Aa7XbYn9YPdejf1k8IpkCTU3gZ.3Z.",
		Publish: Rules{
			Allow: []Grant{
				checkTopology(),
				grant("its own subjects", subjects(contract.SubjectEventsPrefix+">", contract.SubjectDeadPrefix+">",
					contract.SubjectJobsPrefix+">", contract.SubjectDelayPrefix+">", contract.SubjectParkedPrefix+">")),
				grant("asking whether the replica holding an account's lease is still connected",
					subjects(contract.AliveSubject("dispatch", "*"))),
				grant("re-creating a lease watch after a reconnect (the client then uses the short create subject)",
					subjects("$JS.API.CONSUMER.CREATE."+shared.KVStream(contract.BucketLeases))),
				grant("its KV buckets (write) and the buckets it reads",
					each([]string{contract.BucketLedger, contract.BucketHealth, contract.BucketSends, contract.BucketLeases,
						contract.BucketLanes, contract.BucketFrequency}, kvWrite),
					each([]string{contract.BucketLeases, contract.BucketLanes, contract.BucketLedger, contract.BucketHealth, contract.BucketSends,
						contract.BucketAccounts, contract.BucketControl, contract.BucketTasks, contract.BucketSuppressions,
						contract.BucketSignals, contract.BucketPolicy, contract.BucketFrequency}, kvRead)),
				grant("loading the suppression list in batches before watching it", kvSnapshot(contract.BucketSuppressions)),
				grant("its consumers on JOBS (three per account, plus short-lived ones that drain parked jobs)",
					subjects("$JS.API.CONSUMER.CREATE."+jobs+".>", "$JS.API.CONSUMER.INFO."+jobs+".*",
						"$JS.API.CONSUMER.MSG.NEXT."+jobs+".*", "$JS.API.CONSUMER.DELETE."+jobs+".*", "$JS.ACK."+jobs+".>")),
				grant("whether a deleted account still has jobs (the last message on its subjects)",
					subjects("$JS.API.STREAM.MSG.GET."+jobs)),
				grant("reading and purging the dead letters it re-queues (retry-dead), or deleting the selected ones",
					subjects("$JS.API.CONSUMER.CREATE."+dead+".>", "$JS.API.CONSUMER.MSG.NEXT."+dead+".*",
						"$JS.API.CONSUMER.DELETE."+dead+".*", "$JS.API.STREAM.PURGE."+dead,
						"$JS.API.STREAM.MSG.GET."+dead, "$JS.API.STREAM.MSG.DELETE."+dead)),
				grant("reading a task's sent events when a job may have been sent before (its ledger of successes)",
					subjects("$JS.API.STREAM.MSG.GET."+events, "$JS.API.DIRECT.GET."+events+".>",
						"$JS.API.CONSUMER.CREATE."+events+".>", "$JS.API.CONSUMER.MSG.NEXT."+events+".*",
						"$JS.API.CONSUMER.DELETE."+events+".*")),
				flowControl(),
			},
			Deny: []Grant{grant("what only others publish", subjects(contract.SubjectTasks, contract.SubjectRenderPrefix+">",
				contract.SubjectControlPrefix+">", contract.SubjectStartPrefix+">"))},
		},
		Subscribe:      inbox(contract.SubjectRequeuePrefix+"*", contract.AliveSubject("dispatch", "*"), contract.SubjectWake),
		AllowResponses: true,
	}
}

func statusUser() User {
	return User{
		Name: "status",
		About: "status: reads EVENTS, writes progress, checkpoints and the recipient index (while it holds the " +
			"fold lease); asks ingest to pause a failing task (circuit breaker); reads DEAD, EVENTS and LOOKUP " +
			"for the operator's pages.",
		PasswordHash: "$2a$06$oFMR36gOtbf4WKchRgZULeod0HByvLmV9rtFd.Q9f7Wkp1hIRGVyy",
		Publish: Rules{
			Allow: []Grant{
				checkTopology(),
				grant("its own subjects", subjects(contract.SubjectControlPrefix+"*", contract.SubjectLookupPrefix+">"),
					kvWrite(contract.BucketProgress), kvWrite(contract.BucketScores), objectWrite(contract.BucketStatus),
					subjects("$KV."+contract.BucketLeases+"."+contract.StatusFoldLease, "$KV."+contract.BucketLeases+"."+contract.StatusFoldLease+".>",
						"$KV."+contract.BucketLeases+".status-replica.>")),
				grant("asking whether the status process holding the fold lease is still connected",
					subjects(contract.AliveSubject("status", "*"))),
				grant("the buckets it reads",
					each([]string{contract.BucketProgress, contract.BucketControl, contract.BucketAccounts, contract.BucketHealth,
						contract.BucketLeases, contract.BucketSignals, contract.BucketScores}, kvRead),
					objectRead(contract.BucketStatus), subjects("$JS.API.STREAM.PURGE."+shared.ObjectStream(contract.BucketStatus))),
				grant("its consumer on EVENTS", durable(contract.StreamEvents, contract.ConsumerStatus)),
				grant("replaying what a previous fold holder left unacknowledged, in stream order (every partition's consumer)",
					statusFoldResets()),
				grant("the fold partitions' consumers: where a new one starts (STATUS_PARTITIONS)",
					subjects("$JS.API.CONSUMER.NAMES."+contract.StreamEvents, "$JS.API.CONSUMER.INFO."+contract.StreamEvents+".*")),
				grant("the operator's pages: a task's dead letters and events, a recipient's index entries (short-lived consumers)",
					browse(contract.StreamDead), browse(contract.StreamEvents), browse(contract.StreamLookup)),
				grant("queue depths per account for the dashboard (read only)",
					subjects("$JS.API.CONSUMER.LIST."+contract.StreamJobs, "$JS.API.CONSUMER.INFO."+contract.StreamJobs+".*")),
				flowControl(),
			},
			Deny: []Grant{grant("what only others publish", subjects(contract.SubjectTasks, contract.SubjectJobsPrefix+">",
				contract.SubjectEventsPrefix+">", contract.SubjectDeadPrefix+">", contract.SubjectRenderPrefix+">")),
				grant("the other services' durable consumers on the streams it browses: no deleting or reconfiguring "+
					"them, no pulling or acknowledging their messages", othersDurables(contract.ConsumerStatus, contract.StreamEvents,
					contract.StreamDead, contract.StreamLookup))},
		},
		Subscribe:      inbox(contract.AliveSubject("status", "*")),
		AllowResponses: true,
	}
}

func feedbackUser() User {
	var receiptEvents []string
	for _, k := range []contract.EventKind{contract.EventDelivered, contract.EventRead, contract.EventUndelivered} {
		receiptEvents = append(receiptEvents, contract.SubjectEventsPrefix+"*."+string(k))
	}
	return User{
		Name: "feedback",
		About: "feedback: stores provider receipts in RECEIPTS, indexes the provider ids of sent events, and " +
			"publishes delivered, read and undelivered events (no other kind).",
		PasswordHash: "$2a$06$JcLVubV0qCbJAW3yC5BTiuuVyeyHYRpk/GPFMeKYQnTOCemXuBZjm",
		Publish: Rules{
			Allow: []Grant{
				checkTopology(),
				grant("its own subjects: receipts, and the receipt kinds of events", subjects(contract.SubjectReceiptsPrefix+">"),
					receiptEvents),
				grant("its KV buckets (write: the index, suppression entries from opt-outs and bounces, and accounts' "+
					"provider signals) and the buckets it reads",
					kvWrite(contract.BucketProviderIDs), kvWrite(contract.BucketSuppressions), kvWrite(contract.BucketSignals),
					each([]string{contract.BucketProviderIDs, contract.BucketAccounts, contract.BucketSuppressions,
						contract.BucketSignals}, kvRead)),
				grant("its consumers: RECEIPTS, and the sent events of EVENTS (index, WxPusher poller)",
					durable(contract.StreamReceipts, contract.ConsumerFeedback),
					durable(contract.StreamEvents, contract.ConsumerFeedbackIndex),
					durable(contract.StreamEvents, contract.ConsumerFeedbackWxPusher)),
				flowControl(),
			},
			Deny: []Grant{grant("what only others publish", subjects(contract.SubjectTasks, contract.SubjectJobsPrefix+">",
				contract.SubjectDeadPrefix+">", contract.SubjectRenderPrefix+">", contract.SubjectControlPrefix+">"))},
		},
		Subscribe: inbox(),
	}
}

func operatorUser() User {
	var protect []string
	for _, d := range serviceDurables {
		for _, h := range historyStreams() {
			if d.stream == h {
				protect = append(protect, durableTouch(d.stream, d.name)...)
			}
		}
	}
	return User{
		Name: "operator",
		About: "operator: people and the nats CLI. Submits tasks, sends control requests, edits accounts and " +
			"uploads recipient lists; reads everything else. May not publish jobs or events, write " +
			"progress or the ledgers, or change streams.",
		PasswordHash: "$2a$06$p9C4yQZQ12LWtjsl4GOXwOj5VB9E195/KvZOgeVrJ2DX9rP2myRL.",
		Publish: Rules{
			Allow: []Grant{
				grant("submit and control", subjects(contract.SubjectTasks, contract.SubjectControlPrefix+"*")),
				grant("edit accounts, their provider signals, the suppression list and the policy, upload recipient lists",
					kvWrite(contract.BucketAccounts), kvWrite(contract.BucketSignals),
					kvWrite(contract.BucketSuppressions), kvWrite(contract.BucketPolicy), objectWrite(contract.BucketRecipients),
					subjects("$JS.API.STREAM.PURGE."+shared.ObjectStream(contract.BucketRecipients))),
				grant("read: stream and consumer info, KV and stream reads",
					subjects("$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.STREAM.INFO.*",
						"$JS.API.STREAM.MSG.GET.*", "$JS.API.DIRECT.GET.>", "$JS.API.CONSUMER.NAMES.*",
						"$JS.API.CONSUMER.LIST.*", "$JS.API.CONSUMER.INFO.*.*")),
				grant("short-lived consumers (kv watch, stream view) on the streams that keep history, never the work queues",
					each(historyStreams(), browse), subjects("$JS.FC.>")),
			},
			Deny: []Grant{
				grant("what only the services publish", subjects(contract.SubjectJobsPrefix+">", contract.SubjectEventsPrefix+">",
					contract.SubjectDeadPrefix+">", contract.SubjectRenderPrefix+">", contract.SubjectDelayPrefix+">",
					contract.SubjectParkedPrefix+">", contract.SubjectStartPrefix+">", contract.SubjectRequeuePrefix+">",
					contract.SubjectAlivePrefix+">", contract.SubjectReceiptsPrefix+">", contract.SubjectLookupPrefix+">",
					contract.SubjectWake)),
				grant("the services' durable consumers on the streams it may read: no deleting or "+
					"reconfiguring them, no pulling or acknowledging their messages", protect),
			},
		},
		Subscribe: Rules{
			Allow: []Grant{grant("it may watch every subject and receives its replies", subjects("_INBOX.>", "broadcast.>"))},
			Deny: []Grant{grant("but never answers or takes what the services serve", subjects(contract.SubjectControlPrefix+">",
				contract.SubjectRequeuePrefix+">", contract.SubjectAlivePrefix+">"))},
		},
	}
}

func viewerUser() User {
	read := func(bucket string) []string {
		s := shared.KVStream(bucket)
		return subjects("$JS.API.STREAM.INFO."+s, "$JS.API.DIRECT.GET."+s+".>", "$JS.API.STREAM.MSG.GET."+s)
	}
	return User{
		Name: "viewer",
		About: "viewer: people who should see progress and account health, but not recipients' data (jobs, " +
			"events, dead letters, lists) nor account values (an endpoint may carry a token). Read-only. " +
			"Development password: dev-viewer-pw.",
		PasswordHash: "$2a$06$fp7BqqK.hZUbCnX3Dik3c.E8JUqQgu8e1nmRd/iBYichdDCxpajLW",
		Publish: Rules{
			Allow: []Grant{
				grant("kv get on broadcast_progress, broadcast_health and broadcast_scores", subjects("$JS.API.INFO"),
					read(contract.BucketProgress), read(contract.BucketHealth), read(contract.BucketScores)),
				grant("kv watch / kv ls: short-lived consumers on those three buckets only",
					browse(shared.KVStream(contract.BucketProgress)), browse(shared.KVStream(contract.BucketHealth)),
					browse(shared.KVStream(contract.BucketScores)), subjects("$JS.FC.>")),
			},
		},
		Subscribe: inbox(),
	}
}

func adminUser() User {
	return User{
		Name: "admin",
		About: "admin: runs `broadcast setup`, the one step that creates and updates the streams, KV buckets " +
			"and object stores (the services only check them). Nothing else: no deleting or purging, no " +
			"other stream, no messages.",
		PasswordHash: "$2a$06$0to1nOdIhHN8R/ouSWxXDeef8u4GDOVyrG5TK6VFSsWBteX4vh2j6",
		Publish: Rules{
			Allow: []Grant{
				grant("account limits (a KV bucket's creation checks them)", subjects("$JS.API.INFO")),
				grant("info, create and update of the topology's streams", each(allStreams(), func(s string) []string {
					return append(streamInfo(s), streamChange(s)...)
				})),
			},
		},
		Subscribe: inbox(),
	}
}

// statusFoldResets are the consumer resets of every partition count's fold
// consumers (contract.StatusConsumer): a new fold holder resets its
// partition's consumer to the acknowledgement floor.
func statusFoldResets() []string {
	var out []string
	for n := 1; n <= contract.MaxStatusPartitions; n++ {
		for k := range n {
			out = append(out, "$JS.API.CONSUMER.RESET."+contract.StreamEvents+"."+contract.StatusConsumer(k, n))
		}
	}
	return subjects(out...)
}
