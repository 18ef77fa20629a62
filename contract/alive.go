package contract

// A service instance that holds work others must take over when it dies
// (dispatch's account leases) answers requests on its alive subject,
// broadcast.alive.<service>.<instance>, for as long as its connection is
// up. The server drops a dead process's subscriptions the moment its
// connection closes, so "no responders" on that subject says the holder is
// gone seconds before its lease would run out. These subjects are
// internal: not part of the contract.

// SubjectAlivePrefix starts every alive subject.
const SubjectAlivePrefix = "broadcast.alive."

// AliveSubject is where instance of service answers that it is alive.
// instance must be a single subject token.
func AliveSubject(service, instance string) string {
	return SubjectAlivePrefix + service + "." + instance
}

// StatusFoldLease is the key in KV broadcast_leases of the one status
// process that folds events into progress; the others stand by. Account
// names cannot contain a dot, so it never clashes with an account's lease.
const StatusFoldLease = "status.fold"
