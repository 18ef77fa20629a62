package channels

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/fakes"
)

// sendAll sends n messages from senders goroutines, each message once,
// and returns their results by index.
func sendAll(s Sender, n, senders int, msg func(i int) Message) []Result {
	results := make([]Result, n)
	var wg sync.WaitGroup
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for range senders {
		wg.Go(func() {
			for i := range next {
				results[i] = s.Send(context.Background(), []Message{msg(i)})[0]
			}
		})
	}
	wg.Wait()
	return results
}

func sharedMail(i int) Message {
	return mailTo(fmt.Sprintf("t1.%d", i), fmt.Sprintf("user%d@example.com", i), "hi")
}

// receivedIDs counts the messages the fake took by Message-ID.
func receivedIDs(t *testing.T, srv *fakes.SMTP) map[string]int {
	t.Helper()
	ids := map[string]int{}
	for _, m := range srv.Received() {
		ids[parseMail(t, m).Header.Get("Message-Id")]++
	}
	return ids
}

// TestSMTPSharedConnectionsCarrySeveralTransactions: with fewer
// connections than concurrency every message still goes out once, over
// no more connections than allowed, several transactions to a write.
func TestSMTPSharedConnectionsCarrySeveralTransactions(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{pipelining: true, chunking: true}, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":8,"connections":2`))

	const n = 400
	for i, r := range sendAll(s, n, 16, sharedMail) {
		require.Equal(t, Result{Code: "250", ProviderID: fmt.Sprintf("t1.%d@shop.example", i)}, r)
	}
	ids := receivedIDs(t, srv)
	require.Len(t, ids, n)
	for id, c := range ids {
		require.Equal(t, 1, c, id)
	}
	c := srv.Counts()
	require.LessOrEqual(t, c.Connections, 2)
	require.EqualValues(t, n, c.Transactions)
	// Every transaction after a group's first starts with RSET, so the
	// resets count the transactions that shared a write with another.
	require.GreaterOrEqual(t, c.Resets, n/4, "groups of several transactions (%+v)", c)
	require.Less(t, c.Resets, n)
}

// TestSMTPSharedConnectionsIsolateRefusals: a refused recipient fails
// alone; the transactions written after it in the same group go through.
func TestSMTPSharedConnectionsIsolateRefusals(t *testing.T) {
	t.Parallel()
	reply := func(i int) string {
		switch i % 5 {
		case 1:
			return "550 5.1.1 No such user"
		case 3:
			return "450 4.2.1 Mailbox busy, try again later"
		}
		return ""
	}
	srv := startSMTP(t, smtpMode{pipelining: true, chunking: true}, fakes.SMTPConfig{Rcpt: func(addr string) string {
		var i int
		_, _ = fmt.Sscanf(addr, "user%d@", &i)
		return reply(i)
	}})
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":8,"connections":2`))

	const n = 200
	ok := 0
	for i, r := range sendAll(s, n, 16, sharedMail) {
		switch reply(i) {
		case "":
			require.True(t, r.OK(), "%d: %+v", i, r)
			ok++
		case "550 5.1.1 No such user":
			require.Equal(t, contract.ClassPermanent, r.Class, "%d: %+v", i, r)
			require.Equal(t, "550", r.Code)
		default:
			require.Equal(t, contract.ClassRetryable, r.Class, "%d: %+v", i, r)
			require.Equal(t, "450", r.Code)
		}
	}
	ids := receivedIDs(t, srv)
	require.Len(t, ids, ok)
	for i := range n {
		require.Equal(t, map[bool]int{true: 1}[reply(i) == ""], ids[fmt.Sprintf("<t1.%d@shop.example>", i)], i)
	}
	require.LessOrEqual(t, srv.Connections(), 2, "refusals do not cost the connection")
}

// TestSMTPSharedConnectionsServerHangsUp: a server that ends sessions
// (421 to MAIL, or hanging up after a message) leaves the rest of a group
// unanswered; sent again, every message arrives exactly once.
func TestSMTPSharedConnectionsServerHangsUp(t *testing.T) {
	t.Parallel()
	for _, cfg := range []fakes.SMTPConfig{{RefuseAfter: 3}, {CloseAfter: 2}} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			srv := startSMTP(t, smtpMode{pipelining: true, chunking: true}, cfg)
			s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":8,"connections":2`))
			const n = 120
			var mu sync.Mutex
			retried := 0
			// Each message is sent until it is accepted, as dispatch
			// retries a retryable result.
			until := func(m Message) Result {
				for range 20 {
					r := s.Send(context.Background(), []Message{m})[0]
					if r.Class != contract.ClassRetryable {
						return r
					}
					mu.Lock()
					retried++
					mu.Unlock()
				}
				return Result{Class: contract.ClassRetryable, Code: "gave up"}
			}
			results := make([]Result, n)
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					for i := g; i < n; i += 16 {
						results[i] = until(sharedMail(i))
					}
				})
			}
			wg.Wait()
			for i, r := range results {
				require.True(t, r.OK(), "%d: %+v", i, r)
			}
			ids := receivedIDs(t, srv)
			require.Len(t, ids, n)
			for id, c := range ids {
				require.Equal(t, 1, c, "%s: the server took nothing of a group after it hung up", id)
			}
			require.Positive(t, retried, "some messages were in a group the server cut")
		})
	}
}

// TestSMTPSharedConnectionsWithoutChunking: a server without CHUNKING
// gets a shared connection's transactions one at a time.
func TestSMTPSharedConnectionsWithoutChunking(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{pipelining: true}, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":6,"connections":2`))
	for i, r := range sendAll(s, 60, 12, sharedMail) {
		require.True(t, r.OK(), "%d: %+v", i, r)
	}
	require.Len(t, receivedIDs(t, srv), 60)
	require.LessOrEqual(t, srv.Connections(), 2)
	require.Zero(t, srv.Counts().Resets)
}

// TestSMTPSharedConnectionsWithdrawQueued: a message whose context ends
// while it waits for a busy connection is taken back unsent; one already
// on its way is reported in doubt.
func TestSMTPSharedConnectionsWithdrawQueued(t *testing.T) {
	t.Parallel()
	var stalls sync.Map
	srv := startSMTP(t, smtpMode{pipelining: true, chunking: true}, fakes.SMTPConfig{Data: func(m fakes.Mail) string {
		if _, ok := stalls.Load(m.To[0]); ok {
			return fakes.SMTPStall
		}
		return ""
	}})
	stalls.Store("user0@example.com", true)
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":2,"connections":1,"timeout":"1s"`))

	first := make(chan Result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		first <- s.Send(ctx, []Message{sharedMail(0)})[0]
	}()
	require.Eventually(t, func() bool { return srv.Counts().Transactions == 1 }, 5*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	r := s.Send(ctx, []Message{sharedMail(1)})[0]
	cancel()
	require.Equal(t, contract.ClassRetryable, r.Class)
	require.Equal(t, "timeout", r.Code)
	require.True(t, strings.HasSuffix(r.Err, "(not sent)"), r.Err)

	r = <-first
	require.Equal(t, contract.ClassRetryable, r.Class)
	require.Contains(t, r.Err, "on its way")

	// The stalled connection times out (1s) and the next message goes out
	// on a new one; the withdrawn message never did.
	require.True(t, s.Send(context.Background(), []Message{sharedMail(2)})[0].OK())
	ids := receivedIDs(t, srv)
	require.Equal(t, map[string]int{"<t1.2@shop.example>": 1}, ids)
	require.EqualValues(t, 2, srv.Counts().Transactions, "the withdrawn message never reached the server")
}

func TestSMTPSharedConnectionsValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []string{"3", "-1"} {
		_, err := SMTP{}.NewSender(testAccount(t, `{"channel":"smtp","host":"h","from":"a@b.c","concurrency":2,"connections":`+c+`}`), nil)
		require.ErrorContains(t, err, "connections: must be between 1 and concurrency (2), got "+c)
	}
}

// TestSMTPSharedConnectionsRedialStale: a pooled shared connection the
// server closed while idle costs no attempt: the group goes out at once
// on a fresh connection.
func TestSMTPSharedConnectionsRedialStale(t *testing.T) {
	t.Parallel()
	for _, cfg := range []fakes.SMTPConfig{{CloseAfter: 1}, {RefuseAfter: 1}} {
		srv := startSMTP(t, smtpMode{pipelining: true, chunking: true}, cfg)
		s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":4,"connections":1`))
		for i := range 5 {
			r := s.Send(context.Background(), []Message{sharedMail(i)})[0]
			require.True(t, r.OK(), "%+v %d: %+v", cfg, i, r)
		}
		require.Len(t, receivedIDs(t, srv), 5)
		require.EqualValues(t, 5, srv.Connections(), "%+v", cfg)
	}
}

// TestSMTPSharedConnectionsRefused: a server that cannot be reached
// answers every waiting message, retryable.
func TestSMTPSharedConnectionsRefused(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{pipelining: true, chunking: true}, fakes.SMTPConfig{})
	srv.Close()
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"concurrency":4,"connections":1`))
	for i, r := range sendAll(s, 12, 6, sharedMail) {
		require.Equal(t, contract.ClassRetryable, r.Class, "%d: %+v", i, r)
		require.Equal(t, "network", r.Code)
	}
}
