package permissions

import (
	"slices"

	"github.com/broadcastd/broadcast/shared"
)

// Grant is a group of subjects a user may (or may not) use, with the
// reason for them: the comment above them in auth.conf.
type Grant struct {
	Why      string
	Subjects []string
}

// grant joins subject lists into one Grant.
func grant(why string, parts ...[]string) Grant {
	return Grant{Why: why, Subjects: slices.Concat(parts...)}
}

// subjects is a literal list of subjects.
func subjects(s ...string) []string { return s }

// each applies f to every name and joins the results.
func each(names []string, f func(string) []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, f(n)...)
	}
	return out
}

// allStreams are the streams of the topology (those behind the KV buckets
// and object stores included), in shared.TopologyStreams order.
func allStreams() []string {
	var out []string
	for _, s := range shared.TopologyStreams() {
		out = append(out, s.Stream)
	}
	return out
}

// historyStreams are the streams that keep what they hold (every one but
// the work queues RENDER and JOBS): reading them takes nothing from anyone.
func historyStreams() []string {
	var out []string
	for _, s := range shared.TopologyStreams() {
		if !s.WorkQueue() {
			out = append(out, s.Stream)
		}
	}
	return out
}

// streamInfo reads a stream's configuration and state.
func streamInfo(stream string) []string { return subjects("$JS.API.STREAM.INFO." + stream) }

// streamChange creates a stream or changes its configuration.
func streamChange(stream string) []string {
	return subjects("$JS.API.STREAM.CREATE."+stream, "$JS.API.STREAM.UPDATE."+stream)
}

// kvWrite puts and deletes keys of a KV bucket (a put is a publish).
func kvWrite(bucket string) []string { return subjects("$KV." + bucket + ".>") }

// kvRead gets keys of a KV bucket and watches it (a watch is a short-lived
// push consumer the client deletes when done).
func kvRead(bucket string) []string { return streamRead(shared.KVStream(bucket)) }

// kvSnapshot reads a KV bucket whole through a pulled, short-lived
// consumer: how a process loads a large bucket (the suppression list)
// before it watches it (internal/suppress).
func kvSnapshot(bucket string) []string {
	s := shared.KVStream(bucket)
	return subjects("$JS.API.STREAM.INFO."+s, "$JS.API.CONSUMER.MSG.NEXT."+s+".*")
}

// objectWrite uploads and deletes objects of an object store.
func objectWrite(bucket string) []string { return subjects("$O." + bucket + ".>") }

// objectRead reads objects of an object store (chunks come through a
// short-lived push consumer).
func objectRead(bucket string) []string { return streamRead(shared.ObjectStream(bucket)) }

// streamRead is a client library's read access to a stream: direct and
// stored-message gets, and short-lived push consumers.
func streamRead(stream string) []string {
	return subjects("$JS.API.DIRECT.GET."+stream+".>", "$JS.API.STREAM.MSG.GET."+stream,
		"$JS.API.CONSUMER.CREATE."+stream+".>", "$JS.API.CONSUMER.DELETE."+stream+".*")
}

// durable is the owner's use of its durable consumer: creating (or
// updating) it, its info, pulling and acknowledging.
func durable(stream, consumer string) []string {
	return subjects("$JS.API.CONSUMER.CREATE."+stream+"."+consumer+".>", "$JS.API.CONSUMER.INFO."+stream+"."+consumer,
		"$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, "$JS.ACK."+stream+"."+consumer+".>")
}

// durableTouch is everything a user other than the owner could do to a
// durable consumer: remove or reconfigure it, pull from it, acknowledge
// its messages. The operator's deny list holds it for the durables on the
// streams it may otherwise make consumers on.
func durableTouch(stream, consumer string) []string {
	return subjects("$JS.API.CONSUMER.DELETE."+stream+"."+consumer,
		"$JS.API.CONSUMER.CREATE."+stream+"."+consumer, "$JS.API.CONSUMER.CREATE."+stream+"."+consumer+".>",
		"$JS.API.CONSUMER.MSG.NEXT."+stream+"."+consumer, "$JS.ACK."+stream+"."+consumer+".>")
}

// browse is a short-lived pull consumer, as the nats CLI makes for
// `nats kv watch`, `nats kv ls` and `nats stream view`: create, pull,
// acknowledge, delete.
func browse(stream string) []string {
	return subjects("$JS.API.CONSUMER.CREATE."+stream+".>", "$JS.API.CONSUMER.MSG.NEXT."+stream+".*",
		"$JS.API.CONSUMER.DELETE."+stream+".*", "$JS.ACK."+stream+".>")
}
