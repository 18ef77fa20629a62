// Package harness holds the helpers the end-to-end test packages e2e,
// e2e/dispatch and e2e/crosstask share: a plain library for tests, whose
// functions take a *testing.T and fail it through testify's require. The
// servers and services come from internal/pipelinetest; what it starts
// itself is HTTP and SMTP stand-ins and, for DispatchEnv, dispatch
// replicas.
//
// Files:
//   - helpers.go: the pipeline's test configs (FastRetries, WithSecrets),
//     accounts (WebhookAccount), submitting tasks (Submit,
//     SubmitWithMsgID, PutObject) and operator actions (Control), reading
//     and writing KV (KVGet, AccountHealth, WaitAccountHealth, PutSignals),
//     dead letters and events (DeadLetters, EventsOf, CountByKind), and
//     WaitCount.
//   - providers.go: the provider stand-ins: a Recorder of send requests
//     (with an optional sliding-window limit) and the pacing figures of
//     what it saw (MeasurePacing), the fault-injecting gateway behind it
//     (StartGateway, StartRecordedGateway, GatewayOK), and the SMTP fake
//     (StartSMTP).
//   - dispatch.go: a pipeline whose dispatch replicas a test starts and
//     stops one by one (DispatchEnv), with a log of which replica sent
//     what.
package harness
