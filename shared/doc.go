// Package shared is the runtime machinery every service uses, on top of the
// wire contract (package contract): the one EnsureTopology that creates
// every stream, KV bucket and object store (`broadcast setup` runs it; the
// services only CheckTopology), the consume loop that maps a handler's
// result to Ack / dead-letter+Term / NakWithDelay (now, or once an
// asynchronous step ends: Later), publishing without waiting, live KV views,
// NATS connection settings read from the environment, and slog setup.
//
// Where to edit what:
//   - topology.go: stream / KV / object store definitions and
//     EnsureTopology, which creates or updates them and says what it did.
//   - topologycheck.go: what the services require of the topology
//     (TopologyStreams), CheckTopology, and waiting for it at start.
//   - consume.go, outcome.go: the consume loop and the errors handlers return;
//     workers.go: its handler goroutines, started on demand; gopool.go:
//     goroutines kept between short-lived functions (dispatch's job group
//     parts), so their grown stacks are reused; stophold.go:
//     handing messages back at a stop only once the subscription ended, so
//     a NAKed message is not delivered again to the same stopping loop.
//   - publisher.go: publishing without waiting on the hot paths (render's
//     jobs, dispatch's sent events), leaner than jetstream's PublishAsync
//     and with its semantics (stored once acked, "no responders" retried,
//     a disconnect fails what is pending).
//   - eventpub.go: publishing events with their Nats-Msg-Id.
//   - serve.go: serving core requests concurrently with a bound
//     (ConcurrentHandler, used by ingest's control and dispatch's re-queue
//     subscriptions), per-key ordering (KeyedMutex) and periodic
//     housekeeping loops (Every).
//   - recover.go: keeping a panicking goroutine from killing the service.
//   - setup.go: a service's start steps tried again while a server
//     restart makes them time out (SetUp).
//   - controlwatch.go: the live view of task run states and writing one.
//   - accountwatch.go, healthwatch.go, route.go: live views of accounts and
//     their health, and choosing an account for a recipient;
//     signalswatch.go: the providers' signals per account and a
//     portfolio's limit.
//   - kvview.go, kvwatch.go: a KV bucket kept in memory, and following a
//     watch from its current values on (FollowBucket: a whole bucket,
//     started over after each reconnect, since a server restart leaves a
//     watch stale for about 20 s).
//   - nats.go, logging.go: connection (over a socket, or in process to an
//     embedded server), a service's start (ConnectService: connect, then
//     wait for the topology) and logging from the environment.
//
// Nothing that only one service uses belongs here.
package shared
