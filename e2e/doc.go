// Package e2e holds end-to-end tests: all four services in one process
// against an embedded nats-server and a real HTTP gateway.
package e2e
