// Package natstest starts embedded nats-servers for tests: one per test, on
// a random loopback port with its store in t.TempDir(), a server from a
// configuration file (users, permissions, TLS) or a JetStream cluster, each
// with the test's own client connected. It is the server-only harness: it
// imports no service and not shared either, so any package's own tests,
// shared's among them, can use it. Whatever the server needs before a test
// (Broadcast's topology, say) the caller passes as a Setup; the pipeline
// harness above the services is internal/pipelinetest.
//
// Files:
//   - natstest.go: Server, Credentials, Setup, Start / StartWith, the
//     client connections (ConnectAs, Dial, DialTLS) and Eventually.
//   - auth.go: StartConfigFile, a server from a configuration file with its
//     users and TLS.
//   - cluster.go: StartCluster, a cluster of embedded servers.
//   - serverlog.go: ServerLog, the server's log lines and permission
//     violations.
//   - imports_test.go: the layering check of internal/ (see its test).
package natstest
