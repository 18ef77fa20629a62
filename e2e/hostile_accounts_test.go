package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/internal/natstest"
	"github.com/broadcastd/broadcast/shared"
)

// TestAbsurdAccountValues writes accounts whose numbers overflowed the
// pacer (a rate of 1e19, a burst at the integer maximum; the batch worker
// crashed dispatch on them, and every replica that took the lease in turn):
// they are invalid, with an error naming the field, tasks that name them
// are rejected, and dispatch keeps sending for the other accounts.
func TestAbsurdAccountValues(t *testing.T) {
	t.Parallel()
	ts := natstest.Start(t)
	gw := startGateway(t, gatewayOK())
	ts.PutAccount(t, "ok", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":200,"burst":10}`, gw.URL))
	ts.PutAccount(t, "huge-rate", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"rate_per_sec":1e19}`, gw.URL))
	ts.PutAccount(t, "huge-burst", fmt.Sprintf(`{"channel":"webhook","endpoint":%q,"burst":9223372036854775807}`, gw.URL))
	ts.PutAccount(t, "huge-batch", `{"channel":"sandbox","rate_per_sec":1e19,"max_batch":50}`)
	natstest.StartPipeline(t, ts, fastRetries())

	for id, c := range map[string]struct{ channel, account, want string }{
		"abs-rate":  {"webhook", "huge-rate", `accounts[0]: account "huge-rate" is misconfigured: rate_per_sec: must be above 0 and at most 1e+06, got 1e+19`},
		"abs-burst": {"webhook", "huge-burst", `accounts[0]: account "huge-burst" is misconfigured: burst: must be between 1 and 1000000, got 9223372036854775807`},
		"abs-batch": {"sandbox", "huge-batch", `accounts[0]: account "huge-batch" is misconfigured: rate_per_sec: must be above 0`},
	} {
		submit(t, ts, shared.Task{ID: id, Channel: c.channel, Template: "hi", Accounts: []string{c.account}, Recipients: []shared.Recipient{{To: "a"}}})
		p := ts.WaitFinal(t, id, 15*time.Second)
		require.Equal(t, shared.StateRejected, p.State, id)
		require.Contains(t, p.Error, c.want, id)
	}

	task := shared.Task{ID: "abs-ok", Channel: "webhook", Template: "hi {{.to}}", Accounts: []string{"ok"}, Recipients: ctlRecipients(50, "u")}
	submit(t, ts, task)
	p := ts.WaitFinal(t, task.ID, 30*time.Second)
	require.Equal(t, shared.StateSucceeded, p.State)
	require.Equal(t, 50, p.Sent)
	require.Equal(t, 50, gw.Ledger().AcceptedKeys(), "only the valid account sent")
}
