// Package pipelinetest is the pipeline harness: it sits above the services
// and runs them in the test's process. A Server is a natstest server with
// Broadcast's topology in place (internal/topologytest's Setup), with
// helpers that speak the contract: PutAccount, Progress, WaitProgress,
// WaitFinal, Events. StartPipeline runs ingest, render, dispatch and status
// against it, each on its own connection as in production.
//
// A service's own tests cannot import it (it imports every service); they
// use internal/topologytest, the same server and topology without the
// services.
//
// Files:
//   - server.go: Server, Start / StartWithTopology,
//     StartConfigFile, StartCluster, NATSConfig.
//   - accounts.go: PutAccount.
//   - progress.go: Progress, WaitProgress, WaitFinal.
//   - events.go: Events, AllEvents.
//   - pipeline.go: PipelineConfig, StartPipeline and the running Pipeline.
//   - recipients.go: Recipients, RecipientsWithRejects (recipient lists).
//   - digests.go: DigestItemsWaiting (items of open digests).
package pipelinetest
