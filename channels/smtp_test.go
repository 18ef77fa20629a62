package channels

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

const smtpPassword = "s3cret-SMTP-pass"

// smtpServer is just enough of an SMTP server for the adapter's tests:
// EHLO/HELO, AUTH PLAIN, MAIL, RCPT, DATA, RSET, NOOP, QUIT, with chosen
// replies. Set the fields before start.
type smtpServer struct {
	// user enables AUTH PLAIN; the password must be smtpPassword.
	user string
	// greeting, mailReply, dataReply replace the normal reply when set;
	// dataReply "stall" never answers the message.
	greeting, mailReply, dataReply string
	// once limits mailReply and dataReply to the server's first
	// transaction.
	once bool
	// rcptReply replaces the reply to RCPT for the given addresses.
	rcptReply map[string]string
	// closeAfter closes a connection after that many messages, like a
	// server's idle timeout would.
	closeAfter int
	// refuseAfter answers the MAIL after that many messages of a
	// connection with 421 and closes it, as a server ending a session
	// does.
	refuseAfter int
	// pipelining offers PIPELINING (RFC 2920); replies then wait until
	// every command received so far is answered, as Postfix's do.
	pipelining bool
	// chunking offers CHUNKING (RFC 3030): BDAT.
	chunking bool
	// lenientData answers DATA with 354 even when no recipient was
	// accepted (the quirk RFC 2920 section 3.1 tells clients to expect),
	// and refuses the message that follows.
	lenientData bool

	ln       net.Listener
	port     int
	accepted atomic.Int32
	quits    atomic.Int32
	// grouped counts MAIL commands that arrived with the next command
	// already in the same read: pipelined transactions.
	grouped atomic.Int32
	resets  atomic.Int32
	// chunks counts BDAT commands.
	chunks atomic.Int32
	// transactions counts MAIL commands.
	transactions atomic.Int32
	wg           sync.WaitGroup
	mu           sync.Mutex
	conns        []net.Conn
	mails        []receivedMail
}

type receivedMail struct {
	From string
	To   []string
	Data []byte
}

func (s *smtpServer) start(t *testing.T) *smtpServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s.ln, s.port = ln, ln.Addr().(*net.TCPAddr).Port
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				s.serve(c)
			}()
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *smtpServer) stop() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *smtpServer) received() []receivedMail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]receivedMail(nil), s.mails...)
}

func (s *smtpServer) serve(c net.Conn) {
	tp := textproto.NewConn(c)
	reply := func(line string) bool {
		_, _ = tp.W.WriteString(line + "\r\n")
		if s.pipelining && tp.R.Buffered() > 0 {
			return true
		}
		return tp.W.Flush() == nil
	}
	if s.greeting != "" {
		reply(s.greeting)
		return
	}
	reply("220 test.local ESMTP ready")
	var from string
	var to []string
	inMail := false
	delivered := 0
	// messageEnd answers a message's end and reports whether the session
	// goes on.
	messageEnd := func(data []byte) bool {
		if len(to) == 0 {
			reply("554 5.5.1 Error: no valid recipients")
			from, inMail = "", false
			return true
		}
		refuse := s.dataReply != "" && (s.transactions.Load() == 1 || !s.once)
		if refuse && s.dataReply == "stall" {
			return true // never answer; the next read ends when the client hangs up
		}
		if refuse {
			reply(s.dataReply)
			from, to, inMail = "", nil, false
			return true
		}
		s.mu.Lock()
		s.mails = append(s.mails, receivedMail{From: from, To: to, Data: data})
		n := len(s.mails)
		s.mu.Unlock()
		reply("250 2.0.0 Ok: queued as Q" + strconv.Itoa(n))
		from, to, inMail = "", nil, false
		delivered++
		return s.closeAfter == 0 || delivered < s.closeAfter
	}
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			from, to, inMail = "", nil, false
			lines := []string{"250-test.local", "250-8BITMIME", "250-ENHANCEDSTATUSCODES"}
			if s.pipelining {
				lines = append(lines, "250-PIPELINING")
			}
			if s.chunking {
				lines = append(lines, "250-CHUNKING")
			}
			if s.user != "" {
				lines = append(lines, "250-AUTH PLAIN")
			}
			lines = append(lines, "250 SIZE 10240000")
			reply(strings.Join(lines, "\r\n"))
		case "HELO":
			reply("250 test.local")
		case "AUTH":
			mech, b64, _ := strings.Cut(arg, " ")
			raw, _ := base64.StdEncoding.DecodeString(b64)
			parts := strings.Split(string(raw), "\x00")
			if strings.ToUpper(mech) == "PLAIN" && len(parts) == 3 && parts[1] == s.user && parts[2] == smtpPassword {
				reply("235 2.7.0 Authentication successful")
			} else {
				reply("535 5.7.8 Authentication credentials invalid")
			}
		case "MAIL":
			if tp.R.Buffered() > 0 {
				s.grouped.Add(1)
			}
			if inMail {
				reply("503 5.5.1 Error: nested MAIL command")
				continue
			}
			if s.refuseAfter > 0 && delivered >= s.refuseAfter {
				reply("421 4.4.2 test.local Error: timeout exceeded, closing")
				_ = tp.W.Flush() // a server says it before it hangs up
				return
			}
			first := s.transactions.Add(1) == 1
			if s.mailReply != "" && (first || !s.once) {
				reply(s.mailReply)
				continue
			}
			from, to, inMail = addrArg(arg), nil, true
			reply("250 2.1.0 Ok")
		case "RCPT":
			if !inMail {
				reply("503 5.5.1 Error: need MAIL command")
				continue
			}
			addr := addrArg(arg)
			if r := s.rcptReply[addr]; r != "" {
				reply(r)
				continue
			}
			to = append(to, addr)
			reply("250 2.1.5 Ok")
		case "DATA":
			if len(to) == 0 && !s.lenientData {
				reply("503 5.5.1 Error: need RCPT command")
				continue
			}
			reply("354 End data with <CR><LF>.<CR><LF>")
			data, err := tp.ReadDotBytes()
			if err != nil {
				return
			}
			if !messageEnd(data) {
				return
			}
		case "BDAT":
			// One chunk, read whatever was refused before it (RFC 3030,
			// 2); the message as sent, its CRLFs as LFs to compare with
			// DATA's.
			size, last, _ := strings.Cut(arg, " ")
			n, err := strconv.Atoi(size)
			if !s.chunking || err != nil || n < 0 || last != "LAST" {
				reply("501 5.5.4 Syntax: BDAT count LAST")
				return
			}
			s.chunks.Add(1)
			chunk := make([]byte, n)
			if _, err := io.ReadFull(tp.R, chunk); err != nil {
				return
			}
			if !inMail {
				reply("503 5.5.1 Error: need MAIL command")
				continue
			}
			if !messageEnd(bytes.ReplaceAll(chunk, []byte("\r\n"), []byte("\n"))) {
				return
			}
		case "RSET":
			s.resets.Add(1)
			from, to, inMail = "", nil, false
			reply("250 2.0.0 Ok")
		case "NOOP":
			reply("250 2.0.0 Ok")
		case "QUIT":
			s.quits.Add(1)
			reply("221 2.0.0 Bye")
			return
		default:
			reply("502 5.5.2 Error: command not recognized")
		}
	}
}

// addrArg extracts the address from "FROM:<a@b> BODY=8BITMIME".
func addrArg(arg string) string {
	start, end := strings.IndexByte(arg, '<'), strings.IndexByte(arg, '>')
	if start < 0 || end < start {
		return ""
	}
	return arg[start+1 : end]
}

// smtpMode is what a test server offers of the extensions that change the
// client's transaction.
type smtpMode struct{ pipelining, chunking bool }

// eachTransaction runs test against a server without PIPELINING (go-mail's
// transaction, a round trip per command), one with it (pipelined) and one
// with CHUNKING as well (the message as BDAT in the same write).
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

func smtpAccount(t *testing.T, srv *smtpServer, extra string) *contract.Account {
	js := fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none","from":"Shop <noreply@shop.example>",
		"subject":"Your order","concurrency":2,"timeout":"5s"%s}`, srv.port, extra)
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
func parseMail(t *testing.T, m receivedMail) *mail.Message {
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
	srv := (&smtpServer{pipelining: mode.pipelining, chunking: mode.chunking}).start(t)
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	body := "Hello Li,\n你好！Your code is X-1."
	rs := s.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", body)})

	require.Equal(t, []Result{{Code: "250", ProviderID: "t1.0@shop.example"}}, rs)
	mails := srv.received()
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
	srv := (&smtpServer{}).start(t)
	s := smtpSenderFor(t, smtpAccount(t, srv, `,"html":true,"subject":""`))

	body := `<html><head><style>h1{color:red}</style></head><body><h1>Hi &amp; welcome</h1><p>Your code is <b>X-1</b>.</p></body></html>`
	rs := s.Send(context.Background(), []Message{mailTo("t1.7", "li@example.com", body)})

	require.True(t, rs[0].OK(), "%+v", rs[0])
	msg := parseMail(t, srv.received()[0])
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
	srv := (&smtpServer{user: "shop"}).start(t)
	ok := smtpSenderFor(t, smtpAccount(t, srv, `,"username":"shop","secret_env":"BROADCAST_SECRET_SMTP"`))
	rs := ok.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", "hi")})
	require.True(t, rs[0].OK(), "%+v", rs[0])

	bad, err := SMTP{}.NewSender(smtpAccount(t, srv, `,"username":"shop","secret_env":"BROADCAST_SECRET_SMTP"`), envWith("BROADCAST_SECRET_SMTP", "wrong-"+smtpPassword))
	require.NoError(t, err)
	before := srv.accepted.Load()
	rs = bad.Send(context.Background(), []Message{mailTo("t1.1", "a@example.com", "hi"), mailTo("t1.2", "b@example.com", "hi")})
	require.Len(t, rs, 2)
	for _, r := range rs {
		require.Equal(t, contract.ClassAccountFatal, r.Class)
		require.Equal(t, "535", r.Code)
		require.Contains(t, r.Err, "Authentication credentials invalid")
	}
	requireNoSecret(t, rs, smtpPassword)
	require.Equal(t, before+1, srv.accepted.Load(), "a rejected login is not retried within the batch")
	require.Len(t, srv.received(), 1)
}

func TestSMTPConnectionReuse(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPConnectionReuse)
}

func testSMTPConnectionReuse(t *testing.T, mode smtpMode) {
	srv := (&smtpServer{pipelining: mode.pipelining, chunking: mode.chunking}).start(t)
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	for i := range 5 {
		rs := s.Send(context.Background(), []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
		require.True(t, rs[0].OK(), "send %d: %+v", i, rs[0])
	}
	rs := s.Send(context.Background(), []Message{mailTo("t1.5", "a@example.com", "hi"), mailTo("t1.6", "b@example.com", "hi")})
	require.True(t, rs[0].OK() && rs[1].OK(), "%+v", rs)

	require.Len(t, srv.received(), 7)
	require.EqualValues(t, 1, srv.accepted.Load(), "every Send reuses the one connection")
	if mode.pipelining {
		require.EqualValues(t, 7, srv.grouped.Load(), "MAIL, RCPT and DATA (or BDAT) of each message arrive together")
		require.EqualValues(t, map[bool]int{true: 7}[mode.chunking], srv.chunks.Load(), "BDAT when the server offers CHUNKING")
	} else {
		require.Zero(t, srv.grouped.Load(), "one command at a time")
	}
	require.Zero(t, srv.resets.Load(), "a finished transaction needs no RSET")

	require.NoError(t, s.(io.Closer).Close())
	require.Eventually(t, func() bool { return srv.quits.Load() == 1 }, 5*time.Second, 10*time.Millisecond, "Close says QUIT")
}

func TestSMTPPoolBoundedByConcurrency(t *testing.T) {
	t.Parallel()
	srv := (&smtpServer{}).start(t)
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
	require.Len(t, srv.received(), 24)
	require.LessOrEqual(t, srv.accepted.Load(), int32(2), "no more connections than the account's concurrency")
}

func TestSMTPRedialsAfterServerClosed(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPRedialsAfterServerClosed)
}

func testSMTPRedialsAfterServerClosed(t *testing.T, mode smtpMode) {
	srv := (&smtpServer{closeAfter: 1, pipelining: mode.pipelining, chunking: mode.chunking}).start(t)
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))

	for i := range 3 {
		rs := s.Send(context.Background(), []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
		require.True(t, rs[0].OK(), "send %d: %+v", i, rs[0])
	}
	require.Len(t, srv.received(), 3, "each message delivered exactly once")
	require.EqualValues(t, 3, srv.accepted.Load())
}

// TestSMTPRedialsAfter421: a server that ends a pooled session with 421
// to MAIL (and hangs up) costs no attempt: nothing was sent, so the
// message goes out at once on a fresh connection, pipelined or not.
func TestSMTPRedialsAfter421(t *testing.T) {
	t.Parallel()
	eachTransaction(t, func(t *testing.T, mode smtpMode) {
		srv := (&smtpServer{refuseAfter: 2, pipelining: mode.pipelining, chunking: mode.chunking}).start(t)
		s := smtpSenderFor(t, smtpAccount(t, srv, ""))
		for i := range 5 {
			rs := s.Send(context.Background(), []Message{mailTo("t1."+strconv.Itoa(i), "li@example.com", "hi")})
			require.True(t, rs[0].OK(), "send %d: %+v", i, rs[0])
		}
		require.Len(t, srv.received(), 5, "each message delivered exactly once")
		require.EqualValues(t, 3, srv.accepted.Load(), "a connection per two messages")
	})
}

func TestSMTPReplyClasses(t *testing.T) {
	t.Parallel()
	eachTransaction(t, func(t *testing.T, mode smtpMode) { testSMTPReplyClasses(t, mode) })
	// A server that answers DATA with 354 after refusing every recipient
	// gets an empty message's end and a RSET, and keeps the connection.
	t.Run("pipelined/lenient data", func(t *testing.T) {
		t.Parallel()
		testSMTPReplyClasses(t, smtpMode{pipelining: true}, func(s *smtpServer) { s.lenientData = true })
	})
}

func testSMTPReplyClasses(t *testing.T, mode smtpMode, quirks ...func(*smtpServer)) {
	srv := &smtpServer{pipelining: mode.pipelining, chunking: mode.chunking, rcptReply: map[string]string{
		"busy@example.com":   "450 4.2.1 Mailbox busy, try again later",
		"nouser@example.com": "550 5.1.1 No such user",
		"full@example.com":   "452 4.2.2 Mailbox full",
	}}
	for _, q := range quirks {
		q(srv)
	}
	srv.start(t)
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
	require.Len(t, srv.received(), 1)
	require.EqualValues(t, 1, srv.accepted.Load(), "rejected recipients do not cost the connection")
	require.EqualValues(t, 3, srv.resets.Load(), "each refused transaction is reset")
}

func TestSMTPTransactionFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		srv   *smtpServer
		class contract.ErrorClass
		code  string
	}{
		{"data 554 rejected", &smtpServer{dataReply: "554 5.7.1 Message rejected as spam"}, contract.ClassPermanent, "554"},
		{"data 451 later", &smtpServer{dataReply: "451 4.3.0 Temporary failure, try later"}, contract.ClassRetryable, "451"},
		{"mail 553 sender refused", &smtpServer{mailReply: "553 5.7.1 Sender address rejected: not owned by user"}, contract.ClassAccountFatal, "553"},
		{"mail 451 later", &smtpServer{mailReply: "451 4.3.2 System not accepting messages"}, contract.ClassRetryable, "451"},
		{"mail 530 auth required", &smtpServer{mailReply: "530 5.7.0 Authentication required"}, contract.ClassAccountFatal, "530"},
		{"greeting 421 busy", &smtpServer{greeting: "421 4.3.2 Too many connections"}, contract.ClassRetryable, "421"},
		{"greeting 554 refused", &smtpServer{greeting: "554 5.7.1 Access denied"}, contract.ClassAccountFatal, "554"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachTransaction(t, func(t *testing.T, mode smtpMode) {
				srv := &smtpServer{greeting: tt.srv.greeting, mailReply: tt.srv.mailReply, dataReply: tt.srv.dataReply,
					pipelining: mode.pipelining, chunking: mode.chunking, once: true}
				srv.start(t)
				s := smtpSenderFor(t, smtpAccount(t, srv, ""))
				rs := s.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", "hi")})
				require.Equal(t, tt.class, rs[0].Class, "%+v", rs[0])
				require.Equal(t, tt.code, rs[0].Code)
				require.NotEmpty(t, rs[0].Err)
				require.Empty(t, rs[0].ProviderID)
				require.Empty(t, srv.received())
				if tt.class == contract.ClassAccountFatal || tt.srv.greeting != "" {
					return
				}
				// A refused transaction leaves the connection fit for the next.
				rs = s.Send(context.Background(), []Message{mailTo("t1.1", "li@example.com", "hi")})
				require.True(t, rs[0].OK(), "%+v", rs[0])
				require.Len(t, srv.received(), 1)
			})
		})
	}
}

func TestSMTPConnectionRefused(t *testing.T) {
	t.Parallel()
	srv := (&smtpServer{}).start(t)
	srv.stop()
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))
	rs := s.Send(context.Background(), []Message{mailTo("t1.0", "li@example.com", "hi"), mailTo("t1.1", "wang@example.com", "hi")})
	for _, r := range rs {
		require.Equal(t, contract.ClassRetryable, r.Class)
		require.Equal(t, "network", r.Code)
	}
}

func TestSMTPCancelledContext(t *testing.T) {
	t.Parallel()
	srv := (&smtpServer{}).start(t)
	s := smtpSenderFor(t, smtpAccount(t, srv, ""))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rs := s.Send(ctx, []Message{mailTo("t1.0", "li@example.com", "hi")})
	require.Equal(t, contract.ClassRetryable, rs[0].Class)
	require.Empty(t, srv.received())
}

func TestSMTPContextEndsStalledSend(t *testing.T) {
	t.Parallel()
	eachTransaction(t, testSMTPContextEndsStalledSend)
}

func testSMTPContextEndsStalledSend(t *testing.T, mode smtpMode) {
	srv := (&smtpServer{dataReply: "stall", pipelining: mode.pipelining, chunking: mode.chunking}).start(t)
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
	require.EqualValues(t, 2, srv.accepted.Load(), "a connection cut by the context is not reused")
}

func TestHTMLToText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "Title\nLine one\nLine two\n\nItem & more", htmlToText(
		"<h1>Title</h1><script>alert('x')</script>Line one<br>Line two<p></p><p></p><ul><li>Item &amp;   more</li></ul>"))
	require.Equal(t, "plain", htmlToText("plain"))
}

func FuzzSMTPNormalizeRecipient(f *testing.F) {
	for _, s := range []string{"li@example.com", "Li <LI@Example.COM>", `"a b"@example.com`, "a@[127.0.0.1]", "a@b", "@b", "a@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out, err := SMTP{}.NormalizeRecipient(in)
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
