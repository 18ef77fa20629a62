// Package permissions is the table of the servers' users and what each may
// publish and subscribe to, written in terms of the topology (streams, KV
// buckets, object stores, the services' durable consumers and subjects
// from package contract), and what is generated from it: auth.conf at the
// repository root, which nats.conf and deploy/cluster's nodes include
// (`broadcast authconf -o auth.conf`), and the same users as nsc commands
// for decentralized authentication (`broadcast authconf -nsc`).
//
// Only admin, which runs `broadcast setup`, may create or update streams;
// the services check the topology with stream info alone.
//
// Files:
//   - users.go: the table: every user, its grants and why.
//   - grants.go: the building blocks of grants (reading a KV bucket,
//     owning a durable consumer, browsing a stream, ...).
//   - authconf.go: auth.conf, with its explanatory header.
//   - nsc.go: the nsc commands.
//
// The test fails when the committed auth.conf differs from the table's.
package permissions
