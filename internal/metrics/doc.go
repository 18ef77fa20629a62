// Package metrics defines Broadcast's Prometheus metrics, one set per
// service, and serves them.
//
// Nothing registers with the global default registry: a process builds one
// registry with NewRegistry and hands it to every service it runs (the all,
// dev and demo modes run several services in one process, one registry).
// Each service registers only its own metric names, so sharing a registry
// never collides; a second service of the same kind in one registry shares
// the first one's collectors.
//
// Every set is nil-safe: a service built without a registry gets a nil set
// whose methods do nothing.
//
// Labels are bounded: account names (configured by operators), outcome and
// error class (fixed lists), never task ids or recipients.
//
// Where to edit what: metrics.go (registry, HTTP handler, server), one file
// per service for its metrics (ingest.go, render.go, dispatch.go, status.go).
package metrics
