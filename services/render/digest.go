package render

import "github.com/broadcastd/broadcast/contract"

// setDigest copies the task's digest fields into its job, which dispatch
// merges with other tasks' jobs to the same recipient (docs/digests.md).
// Test recipients are never merged: they are checked before the blast.
func setDigest(job *contract.Job, t *contract.Task) {
	if t.DigestKey == "" || job.Test {
		return
	}
	job.DigestKey = t.DigestKey
	job.DigestWindow = contract.Duration(t.DigestWindowDuration())
	job.DigestTemplate = t.DigestTemplate
}
