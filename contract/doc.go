// Package contract is Broadcast's wire contract: what outside programs and
// tests may import to talk to a Broadcast deployment. It holds subject,
// stream, bucket and consumer names, the JSON shapes that travel on the
// wire (task, job, event, progress, account, account health, provider
// signals, health score, control
// state, dead letter, the re-queue request), their validation, and the
// template language a task's template is written in (its limits are part
// of what intake accepts). It imports nothing of Broadcast's runtime
// (shared, services, internal): `go list -deps ./contract` shows it.
//
// Where to edit what:
//   - subjects.go: subject, stream and bucket names, id syntax.
//   - consumers.go: durable consumer names, dispatch's per-lane ones too.
//   - task.go: the task users publish and its validation.
//   - job.go, event.go, progress.go, account.go, deadletter.go: wire shapes.
//   - health.go, control.go: account health and task run state (KV
//     values), the control requests and replies.
//   - signals.go: what providers say of an account (KV broadcast_signals:
//     quality rating, messaging limit) and what a rating does.
//   - warmup.go: an account's warm-up ramp and its cap on a given day.
//   - score.go: an account's health score (KV broadcast_scores).
//   - requeue.go: the re-queue request ingest sends dispatch.
//   - lookup.go: the recipient index (stream LOOKUP): its subjects and
//     entries.
//   - taskrecord.go: the task record and render batches (ingest to render).
//   - errclass.go: the error classes of send outcomes.
//   - codec.go: fast JSON for jobs, events and incoming tasks (go-json,
//     checked against encoding/json, which still words every error).
//   - eventcodec.go: the event encoder written out by hand, byte for byte
//     encoding/json's (a job handler's new goroutine need not grow its
//     stack to go-json's encoder).
//   - template.go: message templates, their limits, the plain fast path,
//     and the refusal of any output that would read "<no value>".
//   - template_cost.go: print, printf and the escapers bounded before they
//     build anything (ErrTemplateCost).
//   - size.go: the JSON size of a recipient's variables and its limit.
//   - secretenv.go: which environment variables an account's secret_env
//     may name.
//   - strconv.go: small number formatting helpers.
package contract
