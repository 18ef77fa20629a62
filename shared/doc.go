// Package shared holds Broadcast's contract and the machinery every service
// uses: subject and bucket names, the JSON shapes that travel on the wire
// (task, job, event, progress, account, dead letter), the one EnsureTopology
// that creates every stream, KV bucket and object store, the consume loop that
// maps a handler's result to Ack / dead-letter+Term / NakWithDelay (now, or
// once an asynchronous step ends: Later), NATS
// connection settings read from the environment, and slog setup.
//
// Where to edit what:
//   - subjects.go: subject, stream and bucket names, id syntax.
//   - task.go: the task users publish and its validation.
//   - job.go, event.go, progress.go, account.go, deadletter.go: wire shapes.
//   - eventpub.go: publishing events with their Nats-Msg-Id.
//   - codec.go: fast JSON for jobs, events and incoming tasks (go-json,
//     checked against encoding/json, which still words every error).
//   - template.go: message templates, their limits, the plain fast path,
//     and the refusal of any output that would read "<no value>".
//   - template_cost.go: print, printf and the escapers bounded before they
//     build anything (ErrTemplateCost).
//   - secretenv.go: which environment variables an account's secret_env
//     may name.
//   - recover.go: keeping a panicking goroutine from killing the service.
//   - topology.go: stream / KV / object store definitions.
//   - consume.go, outcome.go: the consume loop and the errors handlers return.
//   - publisher.go: publishing without waiting on the hot paths (render's
//     jobs, dispatch's sent events), leaner than jetstream's PublishAsync
//     and with its semantics (stored once acked, "no responders" retried,
//     a disconnect fails what is pending).
//   - serve.go: serving core requests concurrently with a bound
//     (ConcurrentHandler, used by ingest's control and dispatch's re-queue
//     subscriptions), per-key ordering (KeyedMutex) and periodic
//     housekeeping loops (Every).
//   - size.go: the JSON size of a recipient's variables and its limit.
//   - taskrecord.go: the task record and render batches (ingest to render).
//   - errclass.go: the error classes of send outcomes.
//   - control.go, controlwatch.go, requeue.go: task run state and its
//     watcher; the re-queue request ingest sends dispatch.
//   - accountwatch.go, health.go, healthwatch.go, route.go: live views of
//     accounts and their health, and choosing an account for a recipient.
//   - kvview.go, kvwatch.go: a KV bucket kept in memory, and following a
//     watch from its current values on.
//   - strconv.go: small number formatting helpers.
//   - nats.go, logging.go: connection (over a socket, or in process to an
//     embedded server) and logging from the environment.
//
// Nothing that only one service uses belongs here.
package shared
