package channels

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/mail"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/fakes"
)

const smtpPassword = "s3cret-SMTP-pass"

// startSMTP starts the SMTP fake (internal/fakes) offering mode's
// extensions, with cfg's answers and quirks.
func startSMTP(t *testing.T, mode smtpMode, cfg fakes.SMTPConfig) *fakes.SMTP {
	t.Helper()
	cfg.NoPipelining, cfg.NoChunking = !mode.pipelining, !mode.chunking
	srv, err := fakes.StartSMTP(cfg)
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return srv
}

// firstOnly answers reply the first time it is asked and nothing (go on)
// after: a refusal of the server's first transaction only.
func firstOnly[T any](reply string) func(T) string {
	var asked atomic.Bool
	return func(T) string {
		if reply == "" || asked.Swap(true) {
			return ""
		}
		return reply
	}
}

// smtpMode is what a test server offers of the extensions that change the
// client's transaction.
type smtpMode struct{ pipelining, chunking bool }

// eachTransaction runs test against a server without PIPELINING (a round
// trip per command), one with it (pipelined) and one with CHUNKING as
// well (the message as BDAT in the same write).
func eachTransaction(t *testing.T, test func(t *testing.T, mode smtpMode)) {
	for _, m := range []struct {
		name string
		mode smtpMode
	}{{"serial", smtpMode{}}, {"pipelined", smtpMode{pipelining: true}}, {"chunked", smtpMode{pipelining: true, chunking: true}}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			test(t, m.mode)
		})
	}
}

func smtpAccount(t *testing.T, srv *fakes.SMTP, extra string) *contract.Account {
	js := fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none","from":"Shop <noreply@shop.example>",
		"subject":"Your order","concurrency":2,"timeout":"5s"%s}`, srv.Port(), extra)
	return testAccount(t, js)
}

func smtpSenderFor(t *testing.T, acct *contract.Account) Sender {
	t.Helper()
	s, err := SMTP{}.NewSender(acct, envWith("BROADCAST_SECRET_SMTP", smtpPassword))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.(io.Closer).Close() })
	return s
}

func mailTo(id, to, body string) Message {
	return Message{ID: id, TaskID: "t1", To: to, Body: body}
}

// parseMail reads a received message.
func parseMail(t *testing.T, m fakes.Mail) *mail.Message {
	t.Helper()
	msg, err := mail.ReadMessage(bytes.NewReader(m.Data))
	require.NoError(t, err)
	return msg
}

// decodePart decodes a body by its Content-Transfer-Encoding.
func decodePart(t *testing.T, cte string, r io.Reader) string {
	t.Helper()
	if strings.EqualFold(cte, "quoted-printable") {
		r = quotedprintable.NewReader(r)
	}
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return strings.TrimRight(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n")
}

func TestSMTPNormalizeRecipient(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want, err string }{
		{in: "li@example.com", want: "li@example.com"},
		{in: " Li.Wang@Example.COM ", want: "Li.Wang@example.com"},
		{in: "Li Wang <li@Mail.Example.com>", want: "li@mail.example.com"},
		{in: "", err: "must not be empty"},
		{in: "not an email", err: "is not an email address"},
		{in: "li@", err: "is not an email address"},
		{in: `"li wang"@example.com`, err: "quoted or unusual local parts are not supported"},
		{in: "li@example.com\r\nBcc: x@y.z", err: "is not an email address"},
		{in: strings.Repeat("a", 64) + "@" + strings.Repeat("b", 190) + ".com", err: "limit is 254"},
	}
	for _, tt := range tests {
		got, err := SMTP{}.NormalizeRecipient(tt.in)
		if tt.err != "" {
			require.ErrorContains(t, err, tt.err, tt.in)
			continue
		}
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.want, got)
	}
	require.ErrorContains(t, SMTP{}.CheckBody("  "), "must not be empty")
	require.NoError(t, SMTP{}.CheckBody("hi"))
}

func TestSMTPNewSenderValidation(t *testing.T) {
	t.Parallel()
	env := envWith("BROADCAST_SECRET_SMTP", smtpPassword)
	tests := []struct{ account, err string }{
		{`{"channel":"smtp","from":"a@b.c"}`, "host: required"},
		{`{"channel":"smtp","host":"h","from":"a@b.c","tls":"ssl"}`, `tls: want "starttls", "tls" or "none", got "ssl"`},
		{`{"channel":"smtp","host":"h","from":"a@b.c","port":70000}`, "port: must be between 1 and 65535"},
		{`{"channel":"smtp","host":"h","from":"nobody"}`, `from: "nobody" is not an email address`},
		{`{"channel":"smtp","host":"h","from":"a@b.c","username":"u"}`, "secret_env: required"},
		{`{"channel":"smtp","host":"h","from":"a@b.c","username":"u","secret_env":"NOPE"}`, "secret_env: environment variable NOPE is empty or unset"},
		{`{"channel":"smtp","host":"h","from":"a@b.c","username":"u","secret_env":"BROADCAST_SECRET_SMTP","auth":"ntlm"}`, `auth: want "plain" or "login"`},
		{`{"channel":"smtp","host":"h","from":"a@b.c","html":"yes"}`, "html: must be bool"},
	}
	for _, tt := range tests {
		_, err := SMTP{}.NewSender(testAccount(t, tt.account), env)
		require.ErrorContains(t, err, tt.err, tt.account)
	}
	// Without a username no password is needed.
	s, err := SMTP{}.NewSender(testAccount(t, `{"channel":"smtp","host":"h","from":"a@b.c"}`), env)
	require.NoError(t, err)
	require.NoError(t, s.(io.Closer).Close())
}

func TestSMTPSendPlain(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPSendPlain)
}

func testSMTPSendPlain(t *testing.T, mode smtpMode) {
	srv := startSMTP(t, mode, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	body := "Hello Li,\n你好！Your code is X-1."
	rs := s.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", body)})

	require.Equal(t, []Result{{Code: "250", ProviderID: "t1.0@shop.example"}}, rs)
	mails := srv.Received()
	require.Len(t, mails, 1)
	require.Equal(t, "noreply@shop.example", mails[0].From)
	require.Equal(t, []string{"li@example.com"}, mails[0].To)
	msg := parseMail(t, mails[0])
	require.Equal(t, "Your order", msg.Header.Get("Subject"))
	from, err := mail.ParseAddress(msg.Header.Get("From"))
	require.NoError(t, err)
	require.Equal(t, &mail.Address{Name: "Shop", Address: "noreply@shop.example"}, from)
	require.Equal(t, "<li@example.com>", msg.Header.Get("To"))
	require.Equal(t, "<t1.0@shop.example>", msg.Header.Get("Message-Id"))
	date, err := msg.Header.Date()
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), date, time.Minute)
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	require.NoError(t, err)
	require.Equal(t, "text/plain", mt)
	require.Equal(t, "utf-8", strings.ToLower(params["charset"]))
	require.Equal(t, body, decodePart(t, msg.Header.Get("Content-Transfer-Encoding"), msg.Body))
}

func TestSMTPSendHTML(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{}, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"html":true,"subject":""`))

	body := `<html><head><style>h1{color:red}</style></head><body><h1>Hi &amp; welcome</h1><p>Your code is <b>X-1</b>.</p></body></html>`
	rs := s.Send(context.Background(), []Message{mailTo("t1.7", "li@example.com", body)})

	require.True(t, rs[0].OK(), "%+v", rs[0])
	msg := parseMail(t, srv.Received()[0])
	require.Equal(t, SMTPDefaultSubject, msg.Header.Get("Subject"))
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	require.NoError(t, err)
	require.Equal(t, "multipart/alternative", mt)
	mr := multipart.NewReader(msg.Body, params["boundary"])
	var parts = map[string]string{}
	var order []string
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		pt, _, err := mime.ParseMediaType(p.Header.Get("Content-Type"))
		require.NoError(t, err)
		order = append(order, pt)
		parts[pt] = decodePart(t, p.Header.Get("Content-Transfer-Encoding"), p)
	}
	// RFC 2046: the preferred (richest) alternative comes last.
	require.Equal(t, []string{"text/plain", "text/html"}, order)
	require.Equal(t, "Hi & welcome\n\nYour code is X-1.", parts["text/plain"])
	require.Equal(t, body, parts["text/html"])
}

func TestSMTPAuth(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{}, fakes.SMTPConfig{User: "shop", Password: smtpPassword})
	ok := smtpSenderFor(t, smtpAccount(t, srv, `,"username":"shop","secret_env":"BROADCAST_SECRET_SMTP"`))
	rs := ok.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", "hi")})
	require.True(t, rs[0].OK(), "%+v", rs[0])

	bad, err := SMTP{}.NewSender(smtpAccount(t, srv, `,"username":"shop","secret_env":"BROADCAST_SECRET_SMTP"`), envWith("BROADCAST_SECRET_SMTP", "wrong-"+smtpPassword))
	require.NoError(t, err)
	before := srv.Connections()
	rs = bad.Send(context.Background(), []Message{mailTo("t1.1", "a@example.com", "hi"), mailTo("t1.2", "b@example.com", "hi")})
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Equal(t, contract.ClassAccountFatal, r.Class)
		require.Equal(t, "535", r.Code)
		require.Contains(t, r.Err, "Authentication credentials invalid")
	}
	requireNoSecret(t, rs, smtpPassword)
	require.Equal(t, before+1, srv.Connections(), "a rejected login is not retried within the batch")
	require.Len(t, srv.Received(), 1)
}

func TestSMTPConnectionReuse(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPConnectionReuse)
}

func testSMTPConnectionReuse(t *testing.T, mode smtpMode) {
	srv := startSMTP(t, mode, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	for i := range 5 {
		rs := s.Send(context.Background(), []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
		require.True(t, rs[0].OK(), "send %d: %+v", i, rs[0])
	}
	rs := s.Send(context.Background(), []Message{mailTo("t1.5", "a@example.com", "hi"), mailTo("t1.6", "b@example.com", "hi")})
	require.True(t, rs[0].OK() && rs[1].OK(), "%+v", rs)

	require.Len(t, srv.Received(), 7)
	require.EqualValues(t, 1, srv.Connections(), "every Send reuses the one connection")
	if mode.pipelining {
		require.EqualValues(t, 7, srv.Counts().Pipelined, "MAIL, RCPT and DATA (or BDAT) of each message arrive together")
		require.EqualValues(t, map[bool]int{true: 7}[mode.chunking], srv.Counts().Chunks, "BDAT when the server offers CHUNKING")
	} else {
		require.Zero(t, srv.Counts().Pipelined, "one command at a time")
	}
	require.Zero(t, srv.Counts().Resets, "a finished transaction needs no RSET")
	require.Zero(t, srv.Counts().Noops, "no NOOP before a transaction: a dead connection shows at MAIL")

	require.NoError(t, s.(io.Closer).Close())
	require.Eventually(t, func() bool { return srv.Counts().Quits == 1 }, 5*time.Second, 10*time.Millisecond, "Close says QUIT")
}

func TestSMTPPoolBoundedByConcurrency(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{}, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, "")) // concurrency 2

	var wg sync.WaitGroup
	var failed atomic.Int32
	for g := range 8 {
		wg.Go(func() {
			for i := range 3 {
				rs := s.Send(context.Background(), []Message{mailTo(fmt.Sprintf("t1.%d", g*10+i), "li@example.com", "hi")})
				if !rs[0].OK() {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()

	require.Zero(t, failed.Load())
	require.Len(t, srv.Received(), 24)
	require.LessOrEqual(t, srv.Connections(), 2, "no more connections than the account's concurrency")
}

func TestSMTPRedialsAfterServerClosed(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPRedialsAfterServerClosed)
}

func testSMTPRedialsAfterServerClosed(t *testing.T, mode smtpMode) {
	srv := startSMTP(t, mode, fakes.SMTPConfig{CloseAfter: 1})
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	for i := range 3 {
		rs := s.Send(context.Background(), []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
		require.True(t, rs[0].OK(), "send %d: %+v", i, rs[0])
	}
	require.Len(t, srv.Received(), 3, "each message delivered exactly once")
	require.EqualValues(t, 3, srv.Connections())
}

// TestSMTPRedialsAfter421: a server that ends a pooled session with 421
// to MAIL (and hangs up) costs no attempt: nothing was sent, so the
// message goes out at once on a fresh connection, pipelined or not.
func TestSMTPRedialsAfter421(t *testing.T) {
	t.Parallel()
	eachTransaction(t, func(t *testing.T, mode smtpMode) {
		srv := startSMTP(t, mode, fakes.SMTPConfig{RefuseAfter: 2})
		s := smtpSenderFor(t, smtpAccount(t, srv, ""))
		for i := range 5 {
			rs := s.Send(context.Background(), []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
			require.True(t, rs[0].OK(), "send %d: %+v", i, rs[0])
		}
		require.Len(t, srv.Received(), 5, "each message delivered exactly once")
		require.EqualValues(t, 3, srv.Connections(), "a connection per two messages")
	})
}

func TestSMTPReplyClasses(t *testing.T) {
	t.Parallel()
	eachTransaction(t, func(t *testing.T, mode smtpMode) { testSMTPReplyClasses(t, mode) })
	// A server that answers DATA with 354 after refusing every recipient
	// gets an empty message's end and a RSET, and keeps the connection.
	t.Run("pipelined/lenient data", func(t *testing.T) {
		t.Parallel()
		testSMTPReplyClasses(t, smtpMode{pipelining: true}, func(c *fakes.SMTPConfig) { c.LenientData = true })
	})
}

func testSMTPReplyClasses(t *testing.T, mode smtpMode, quirks ...func(*fakes.SMTPConfig)) {
	replies := map[string]string{
		"busy@example.com":   "450 4.2.1 Mailbox busy, try again later",
		"nouser@example.com": "550 5.1.1 No such user",
		"full@example.com":   "452 4.2.2 Mailbox full",
	}
	cfg := fakes.SMTPConfig{Rcpt: func(addr string) string { return replies[addr] }}
	for _, q := range quirks {
		q(&cfg)
	}
	srv := startSMTP(t, mode, cfg)
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	rs := s.Send(context.Background(), []Message{
		mailTo("t1.0", "busy@example.com", "hi"),
		mailTo("t1.1", "nouser@example.com", "hi"),
		mailTo("t1.2", "ok@example.com", "hi"),
		mailTo("t1.3", "full@example.com", "hi"),
	})

	require.Equal(t, contract.ClassRetryable, rs[0].Class)
	require.Equal(t, "450", rs[0].Code)
	require.Equal(t, contract.ClassPermanent, rs[1].Class)
	require.Equal(t, "550", rs[1].Code)
	require.Contains(t, rs[1].Err, "No such user")
	require.Equal(t, Result{Code: "250", ProviderID: "t1.2@shop.example"}, rs[2])
	require.Equal(t, contract.ClassRetryable, rs[3].Class)
	require.Equal(t, "452", rs[3].Code)
	require.Len(t, srv.Received(), 1)
	require.EqualValues(t, 1, srv.Connections(), "rejected recipients do not cost the connection")
	require.EqualValues(t, 3, srv.Counts().Resets, "each refused transaction is reset")
}

func TestSMTPTransactionFailures(t *testing.T) {
	t.Parallel()
	// Each refuses the server's first transaction (or every connection,
	// with a greeting).
	tests := []struct {
		name                           string
		greeting, mailReply, dataReply string
		class                          contract.ErrorClass
		code                           string
	}{
		{"data 554 rejected", "", "", "554 5.7.1 Message rejected as spam", contract.ClassPermanent, "554"},
		{"data 451 later", "", "", "451 4.3.0 Temporary failure, try later", contract.ClassRetryable, "451"},
		{"mail 553 sender refused", "", "553 5.7.1 Sender address rejected: not owned by user", "", contract.ClassAccountFatal, "553"},
		{"mail 451 later", "", "451 4.3.2 System not accepting messages", "", contract.ClassRetryable, "451"},
		{"mail 530 auth required", "", "530 5.7.0 Authentication required", "", contract.ClassAccountFatal, "530"},
		{"greeting 421 busy", "421 4.3.2 Too many connections", "", "", contract.ClassRetryable, "421"},
		{"greeting 554 refused", "554 5.7.1 Access denied", "", "", contract.ClassAccountFatal, "554"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachTransaction(t, func(t *testing.T, mode smtpMode) {
				srv := startSMTP(t, mode, fakes.SMTPConfig{Greeting: tt.greeting,
					MailFrom: firstOnly[string](tt.mailReply), Data: firstOnly[fakes.Mail](tt.dataReply)})
				s := smtpSenderFor(t, smtpAccount(t, srv, ""))
				rs := s.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", "hi")})
				require.Equal(t, tt.class, rs[0].Class, "%+v", rs[0])
				require.Equal(t, tt.code, rs[0].Code)
				require.NotEmpty(t, rs[0].Err)
				require.Empty(t, rs[0].ProviderID)
				require.Empty(t, srv.Received())
				if tt.class == contract.ClassAccountFatal || tt.greeting != "" {
					return
				}
				// A refused transaction leaves the connection fit for the next.
				rs = s.Send(context.Background(), []Message{mailTo("t1.1", "li@example.com", "hi")})
				require.True(t, rs[0].OK(), "%+v", rs[0])
				require.Len(t, srv.Received(), 1)
			})
		})
	}
}

func TestSMTPConnectionRefused(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{}, fakes.SMTPConfig{})
	srv.Close()
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))
	rs := s.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", "hi"), mailTo("t1.1", "wang@example.com", "hi")})
	for _, r := range rs {
		require.Equal(t, contract.ClassRetryable, r.Class)
		require.Equal(t, "network", r.Code)
	}
}

func TestSMTPCancelledContext(t *testing.T) {
	t.Parallel()
	srv := startSMTP(t, smtpMode{}, fakes.SMTPConfig{})
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rs := s.Send(ctx, []Message{mailTo("t1.0", "li@example.com", "hi")})
	require.Equal(t, contract.ClassRetryable, rs[0].Class)
	require.Empty(t, srv.Received())
}

func TestSMTPContextEndsStalledSend(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPContextEndsStalledSend)
}

func testSMTPContextEndsStalledSend(t *testing.T, mode smtpMode) {
	srv := startSMTP(t, mode, fakes.SMTPConfig{Data: func(fakes.Mail) string { return fakes.SMTPStall }})
	s := smtpSenderFor(t, smtpAccount(t, srv, "")) // timeout 5s

	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		start := time.Now()
		rs := s.Send(ctx, []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
		cancel()
		require.Less(t, time.Since(start), 2*time.Second, "the context, not the 5s timeout, ends the send")
		require.Equal(t, contract.ClassRetryable, rs[0].Class)
		require.Equal(t, "timeout", rs[0].Code)
	}
	require.EqualValues(t, 2, srv.Connections(), "a connection cut by the context is not reused")
}

func TestHTMLToText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "Title\nLine one\nLine two\n\nItem & more", htmlToText(
		"<h1>Title</h1><script>alert('x')</script>Line one<br>Line two<p></p><p></p><ul><li>Item &amp;   more</li></ul>"))
	require.Equal(t, "plain", htmlToText("plain"))
}

func FuzzSMTPNormalizeRecipient(f *testing.F) {
	for _, s := range []string{"li@example.com", "Li <LI@Example.COM>", `"a b"@example.com`, "a@[127.0.0.1]", "a@b", "@b", "a@",
		"Li.Wang@Example.COM", "a..b@x.y", ".a@x.y", "a@x.y.", "a@b@c", "#!$%&'*+-/=?^_`{|}~@X", "ü@x.y", strings.Repeat("a", 64) + "@" + strings.Repeat("B", 190) + ".com"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := SMTP{}.NormalizeRecipient(in)
		// The dot-atom fast path answers as net/mail's parse does.
		parsed, perr := parseRecipient(strings.TrimSpace(in))
		if strings.TrimSpace(in) != "" {
			require.Equal(t, perr == nil, err == nil, "%q: %v / %v", in, err, perr)
			require.Equal(t, parsed, out, in)
		}
		if err != nil {
			return
		}
		again, err := SMTP{}.NormalizeRecipient(out)
		require.NoError(t, err)
		require.Equal(t, out, again)
		require.NotContains(t, out, "\n")
	})
}

// TestMessageIDSkipsTheRegexpOnlyWhenItWouldChangeNothing: the quick
// check agrees with msgIDUnsafe on every rune up to U+02FF and a few
// beyond, so a job id it passes is one the regexp leaves as it is.
func TestMessageIDSkipsTheRegexpOnlyWhenItWouldChangeNothing(t *testing.T) {
	for r := rune(0); r < 0x300; r++ {
		require.Equal(t, msgIDUnsafe.MatchString(string(r)), msgIDUnsafeRune(r), "%U %q", r, r)
	}
	for _, r := range []rune{'你', '\u2028', '\ufeff', 0x1F600} {
		require.True(t, msgIDUnsafeRune(r), "%U", r)
	}
	for id, want := range map[string]string{
		"01JBENCH7.0":         "01JBENCH7.0@shop.example",
		"t1 (x)<y>@z.0":       "t1--x--y--z.0@shop.example",
		".lead.and.trail.":    "lead.and.trail@shop.example",
		"你好.0":                "--.0@shop.example",
		"...":                 "broadcast@shop.example",
		"a!#$%&'*+/=?^_`{|}~": "a!#$%&'*+/=?^_`{|}~@shop.example",
	} {
		require.Equal(t, want, messageID(id, "shop.example"), id)
	}
}

// TestCRLFBuffer: BDAT sends the message as DATA's dot-writer would have
// delivered it: bare LFs get their CR, CRLFs stay (also split between
// writes), and the last line is ended.
func TestCRLFBuffer(t *testing.T) {
	for _, tt := range []struct {
		writes []string
		want   string
	}{
		{[]string{"a\r\nb\nc"}, "a\r\nb\r\nc\r\n"},
		{[]string{"a\r", "\nb\n"}, "a\r\nb\r\n"},
		{[]string{"\n\n", "x\r\n"}, "\r\n\r\nx\r\n"},
		{[]string{""}, ""},
	} {
		var b crlfBuffer
		for _, w := range tt.writes {
			n, err := b.Write([]byte(w))
			require.NoError(t, err)
			require.Equal(t, len(w), n)
		}
		b.end()
		require.Equal(t, tt.want, b.String(), "%q", tt.writes)
	}
}
