// Package lease decides which process does a piece of work that must have
// exactly one doer at a time: dispatch's sender of each account, status's
// folder of the events. A lease is a key in KV broadcast_leases whose value
// names the holder; the bucket's TTL (shared.LeaseTTL) removes a lease its
// holder stopped refreshing. A holder's term counts from the start of its
// last confirmed refresh, so a refresh may wait for a slow answer while the
// lease is valid, and a refresh stored after its answer was given up on
// leaves the lease naming its holder, who keeps it.
//
// Files:
//   - lease.go: taking, refreshing, checking and releasing one lease, and
//     watching for its release.
//   - presence.go: the alive subject of each holding process, and taking a
//     killed holder's lease before its TTL.
//   - conn.go: whether this process's connection has stayed up since the
//     lease was last confirmed.
//   - share.go: how many leases of a kind each replica takes
//     (FairShare), so the work spreads over the replicas; a replica the
//     server says is gone stops counting at once.
package lease
