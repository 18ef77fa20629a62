package channels

// SMTP channel: email through any SMTP submission server.
//
// Account (KV broadcast_accounts):
//
//	{"channel":"smtp","secret_env":"BROADCAST_SECRET_SMTP_SHOP",
//	 "host":"smtp.example.com","port":587,"tls":"starttls",
//	 "username":"noreply@shop.example","from":"Shop <noreply@shop.example>",
//	 "subject":"Your order","html":true,
//	 "rate_per_sec":5,"concurrency":4,"max_batch":1}
//
//   - host (required), port: defaults to 587 for "starttls", 465 for "tls",
//     25 for "none".
//   - tls: "starttls" (default; the server must offer STARTTLS), "tls"
//     (implicit TLS) or "none" (plain text; only for local relays and tests).
//   - from (required): the sender, optionally with a display name.
//   - username: when set, the connection authenticates (auth "plain", the
//     default, or "login") with the password read from secret_env.
//   - subject: defaults to "Message".
//   - html: send the body as HTML with a plain-text alternative made by
//     stripping the tags. Defaults to false (plain text). Render then
//     HTML-escapes the recipient's variables (HTMLChannel): the template is
//     the HTML, the variables are text.
//   - timeout: per connection and command. Defaults to 30s.
//   - connections: the most connections the account keeps open, 1 to
//     concurrency (the default). Below concurrency each connection
//     carries several transactions at once with a server that offers
//     PIPELINING and CHUNKING (smtp_shared.go): for servers that cap
//     connections per client, and fewer writes and reads per message.
//
// Environment: the variable named by secret_env holds the SMTP password. It
// is required when username is set and never appears in results.
//
// Each message is one email to one recipient, with Message-ID
// <job id@from domain>: the same for every attempt, so a duplicate after an
// unknown outcome (timeout after DATA) can be recognised by mail clients,
// and a bounce leads back to its job. ProviderID is that Message-ID.
//
// Connections: a sender keeps up to the account's concurrency connections
// (or "connections") open and reuses them across Send calls; a connection
// that failed is closed and the next send dials again. An idle connection the server has closed
// is noticed at MAIL FROM, before anything was sent, and the message is
// retried once on a fresh connection. Close (io.Closer) ends them all.
// With a server that offers PIPELINING (RFC 2920; Postfix and Exim do
// by default) MAIL, RCPT and DATA leave together: two round trips
// per message instead of four (smtp_pipeline.go); one that also offers
// CHUNKING (RFC 3030) takes the message as BDAT in the same write, one
// round trip (smtp_chunking.go).
//
// Recipients are email addresses as net/mail parses them; the canonical form
// is the bare address with the domain lower-cased (display names dropped).
//
// Errors, by SMTP reply:
//   - 530, 534, 535, 538 (authentication) and TLS or certificate failures:
//     account fatal. So is a 5xx while connecting or to MAIL FROM: the server
//     refuses this sender, and every message would fail the same way.
//   - other 5xx (550 mailbox unavailable, 553, 554 ...): permanent.
//   - 4xx (421, 450, 451, 452 ...): retryable.
//   - connection errors and timeouts: retryable.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/mail"
	"net/textproto"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	gomail "github.com/wneessen/go-mail"
	"github.com/wneessen/go-mail/smtp"

	"github.com/broadcastd/broadcast/contract"
)

// SMTP defaults.
const (
	SMTPDefaultSubject = "Message"
	smtpDefaultTimeout = 30 * time.Second
	// smtpMaxAddress is RFC 5321's limit on a forward path.
	smtpMaxAddress = 254
)

// SMTP sends email through an SMTP server.
type SMTP struct {
	// Net is where it may connect. Defaults to anywhere.
	Net NetPolicy
}

// Name implements Channel.
func (SMTP) Name() string { return "smtp" }

// NormalizeRecipient validates an email address and returns it bare, with
// the domain lower-cased (the local part is case-sensitive by RFC 5321).
func (SMTP) NormalizeRecipient(to string) (string, error) {
	to = strings.TrimSpace(to)
	if to == "" {
		return "", errors.New("must not be empty")
	}
	if dotAtomAddress(to) {
		// A bare ASCII address, as nearly every list holds: what
		// parseRecipient returns for it, without net/mail's parse (a
		// tenth of ingest's and status's CPU per recipient).
		at := strings.IndexByte(to, '@')
		if domain := strings.ToLower(to[at+1:]); domain != to[at+1:] {
			to = to[:at+1] + domain
		}
		if len(to) > smtpMaxAddress {
			return "", fmt.Errorf("address is %d bytes, limit is %d", len(to), smtpMaxAddress)
		}
		return to, nil
	}
	return parseRecipient(to)
}

// parseRecipient is NormalizeRecipient for a trimmed address that is not
// a bare dot-atom one: a display name, a quoted or non-ASCII local part,
// a domain literal, or not an address at all.
func parseRecipient(to string) (string, error) {
	a, err := mail.ParseAddress(to)
	if err != nil {
		return "", fmt.Errorf("%q is not an email address: %v", to, err)
	}
	at := strings.LastIndexByte(a.Address, '@')
	if at <= 0 || at == len(a.Address)-1 {
		return "", fmt.Errorf("%q is not an email address: want local@domain", to)
	}
	addr := a.Address[:at] + "@" + strings.ToLower(a.Address[at+1:])
	// A local part that needs quotes ("a b"@x) comes back unquoted from
	// net/mail and would be sent unquoted; such addresses are vanishingly
	// rare in practice, so refuse them.
	if (&mail.Address{Address: addr}).String() != "<"+addr+">" {
		return "", fmt.Errorf("%q: quoted or unusual local parts are not supported", to)
	}
	if len(addr) > smtpMaxAddress {
		return "", fmt.Errorf("address is %d bytes, limit is %d", len(addr), smtpMaxAddress)
	}
	return addr, nil
}

// HTMLBody implements HTMLChannel: an account with "html":true.
func (SMTP) HTMLBody(acct *contract.Account) bool {
	var o smtpOptions
	return decodeOptions(acct, &o) == nil && o.HTML
}

// CheckBody rejects empty bodies; size is bounded by the global limit.
func (SMTP) CheckBody(body string) error {
	if strings.TrimSpace(body) == "" {
		return errors.New("must not be empty")
	}
	return nil
}

// smtpOptions are the SMTP-specific account fields.
type smtpOptions struct {
	Host     string            `json:"host"`
	Port     int               `json:"port"`
	Username string            `json:"username"`
	Auth     string            `json:"auth"`
	From     string            `json:"from"`
	TLS      string            `json:"tls"`
	Subject  string            `json:"subject"`
	HTML     bool              `json:"html"`
	Timeout  contract.Duration `json:"timeout"`
	// Connections bounds the open connections; 0 means concurrency.
	Connections int `json:"connections"`
}

// NewSender implements Channel.
func (m SMTP) NewSender(acct *contract.Account, getenv func(string) string) (Sender, error) {
	var o smtpOptions
	if err := decodeOptions(acct, &o); err != nil {
		return nil, err
	}
	if o.Host == "" {
		return nil, errors.New("host: required, the SMTP server's name")
	}
	if o.TLS == "" {
		o.TLS = "starttls"
	}
	defaultPort := map[string]int{"starttls": 587, "tls": 465, "none": 25}[o.TLS]
	if defaultPort == 0 {
		return nil, fmt.Errorf("tls: want \"starttls\", \"tls\" or \"none\", got %q", o.TLS)
	}
	if o.Port == 0 {
		o.Port = defaultPort
	}
	if o.Port < 1 || o.Port > 65535 {
		return nil, fmt.Errorf("port: must be between 1 and 65535, got %d", o.Port)
	}
	from, err := mail.ParseAddress(o.From)
	if err != nil {
		return nil, fmt.Errorf("from: %q is not an email address: %v", o.From, err)
	}
	if o.Subject == "" {
		o.Subject = SMTPDefaultSubject
	}
	concurrency := max(acct.Concurrency, 1)
	if o.Connections < 0 || o.Connections > concurrency {
		return nil, &contract.FieldError{Field: "connections",
			Reason: fmt.Sprintf("must be between 1 and concurrency (%d), got %d", concurrency, o.Connections)}
	}
	timeout := requestTimeout(o.Timeout, smtpDefaultTimeout)
	s := &smtpSender{
		from:    *from,
		domain:  from.Address[strings.LastIndexByte(from.Address, '@')+1:],
		subject: o.Subject,
		html:    o.HTML,
		slots:   make(chan struct{}, concurrency),
		dialer:  m.Net.dialer(timeout),
		timeout: timeout,
	}
	opts := []gomail.Option{
		gomail.WithPort(o.Port), gomail.WithTimeout(timeout), gomail.WithDialContextFunc(s.dialConn),
		// Pooled connections are checked by the first command instead of
		// a NOOP per message, and a finished DATA needs no RSET.
		gomail.WithoutNoop(), gomail.WithoutRset(),
	}
	switch o.TLS {
	case "tls":
		// With a custom dial function go-mail does not wrap TLS itself.
		s.tlsConfig = &tls.Config{ServerName: o.Host, MinVersion: tls.VersionTLS12}
		opts = append(opts, gomail.WithSSL())
	case "starttls":
		opts = append(opts, gomail.WithTLSPolicy(gomail.TLSMandatory))
	case "none":
		opts = append(opts, gomail.WithTLSPolicy(gomail.NoTLS))
	}
	if o.Username != "" {
		if o.TLS == "none" && !IsLoopbackHost(o.Host) {
			return nil, fmt.Errorf("tls: \"none\" would send the password for %q in plain text to %s: use \"starttls\" or \"tls\" (plain text is allowed only to localhost, 127.0.0.0/8 and ::1)", o.Username, o.Host)
		}
		auth := map[string]gomail.SMTPAuthType{"": gomail.SMTPAuthPlain, "plain": gomail.SMTPAuthPlain, "login": gomail.SMTPAuthLogin}[strings.ToLower(o.Auth)]
		if auth == "" {
			return nil, fmt.Errorf("auth: want \"plain\" or \"login\", got %q", o.Auth)
		}
		password, err := secret(acct, getenv, true)
		if err != nil {
			return nil, err
		}
		s.password = password
		opts = append(opts, gomail.WithSMTPAuth(auth), gomail.WithUsername(o.Username), gomail.WithPassword(password))
	}
	s.client, err = gomail.NewClient(o.Host, opts...)
	if err != nil {
		return nil, fmt.Errorf("smtp client: %v", err)
	}
	if !o.HTML {
		// Without them every message is built by go-mail (compose).
		s.plainHeaders, _ = s.accountHeaders()
		s.envelopeFrom = (&mail.Address{Address: from.Address}).String()
	}
	if o.Connections > 0 && o.Connections < concurrency {
		s.connections = o.Connections
		s.depth = (concurrency + o.Connections - 1) / o.Connections
		s.wake = sync.NewCond(&s.mu)
	}
	return s, nil
}

type smtpSender struct {
	// client holds the connection settings; connections are dialled from
	// it but owned by the pool below.
	client    *gomail.Client
	dialer    *net.Dialer
	tlsConfig *tls.Config  // implicit TLS only
	from      mail.Address // parsed once: go-mail would parse a string per message
	domain    string
	subject   string
	html      bool
	password  string
	timeout   time.Duration // per command, as go-mail's
	// plainHeaders are the account's Subject and From fields for
	// plain-text messages (compose); nil for HTML accounts.
	plainHeaders []byte
	envelopeFrom string // <from address>, MAIL FROM's argument

	// slots bounds the messages in flight to the account's concurrency,
	// and with them the open connections unless connections is set.
	slots  chan struct{}
	mu     sync.Mutex
	idle   []*smtpConn
	closed bool

	// connections, when above 0, is the fewer connections than
	// concurrency the account keeps, each carrying up to depth
	// transactions at once (smtp_shared.go); wake, queue, workers and
	// waiting belong to it.
	connections, depth int
	wake               *sync.Cond
	queue              []*smtpTxn
	workers, waiting   int
}

var _ io.Closer = (*smtpSender)(nil)

// smtpConn is a pooled connection. raw is the network connection under
// the SMTP client: closing it interrupts a command blocked on the server,
// which smtp.Client.Close cannot (it waits for the command's lock).
type smtpConn struct {
	*smtp.Client
	raw net.Conn
	// dirty says the last transaction on a shared connection was refused,
	// so the next starts with RSET; broken that the connection must go.
	dirty, broken bool
}

func (c *smtpConn) close() { _ = c.raw.Close() }

// Send delivers each message as its own email over one pooled connection.
func (s *smtpSender) Send(ctx context.Context, msgs []Message) []Result {
	if s.connections > 0 {
		return s.sendShared(ctx, msgs)
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return Fail(len(msgs), Result{Class: contract.ClassRetryable, Code: "timeout", Err: "smtp: " + ctx.Err().Error()})
	}
	defer func() { <-s.slots }()
	conn := s.take()
	out := make([]Result, len(msgs))
	for i, m := range msgs {
		out[i], conn = s.deliver(ctx, conn, m)
		if out[i].Class == contract.ClassAccountFatal {
			for j := i + 1; j < len(msgs); j++ {
				out[j] = out[i]
				out[j].ProviderID = ""
			}
			break
		}
	}
	s.put(conn)
	return out
}

// Close says QUIT on every idle connection; connections in use are closed
// when their Send returns (shared ones once the transactions waiting for
// them are done). The sender must not be used afterwards.
func (s *smtpSender) Close() error {
	s.mu.Lock()
	idle := s.idle
	s.idle, s.closed = nil, true
	if s.wake != nil {
		s.wake.Broadcast() // idle shared connections say QUIT
	}
	s.mu.Unlock()
	for _, c := range idle {
		// QUIT is a courtesy; do not let a silent server hold Close.
		_ = c.UpdateDeadline(2 * time.Second)
		_ = c.Quit()
		c.close()
	}
	return nil
}

func (s *smtpSender) take() *smtpConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.idle); n > 0 {
		c := s.idle[n-1]
		s.idle = s.idle[:n-1]
		return c
	}
	return nil
}

func (s *smtpSender) put(c *smtpConn) {
	if c == nil {
		return
	}
	s.mu.Lock()
	keep := !s.closed
	if keep {
		s.idle = append(s.idle, c)
	}
	s.mu.Unlock()
	if !keep {
		c.close()
	}
}

// connHolderKey carries a *net.Conn through go-mail's dial so dial learns
// the raw connection.
type connHolderKey struct{}

// dialConn is go-mail's dial function.
func (s *smtpSender) dialConn(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	var err error
	if s.tlsConfig != nil {
		conn, err = (&tls.Dialer{NetDialer: s.dialer, Config: s.tlsConfig}).DialContext(ctx, network, addr)
	} else {
		conn, err = s.dialer.DialContext(ctx, network, addr)
	}
	if h, ok := ctx.Value(connHolderKey{}).(*net.Conn); ok && err == nil {
		*h = conn
	}
	return conn, err
}

// dial connects, greets, starts TLS and authenticates. go-mail leaves the
// connection open when a step after the TCP dial fails; dial closes it.
func (s *smtpSender) dial(ctx context.Context) (*smtpConn, error) {
	var raw net.Conn
	c, err := s.client.DialToSMTPClientWithContext(context.WithValue(ctx, connHolderKey{}, &raw))
	if err != nil {
		if raw != nil {
			_ = raw.Close()
		}
		return nil, err
	}
	return &smtpConn{Client: c, raw: raw}, nil
}

// deliver sends one message, dialling when conn is nil, and returns the
// connection to keep using (nil when it is no longer usable).
func (s *smtpSender) deliver(ctx context.Context, conn *smtpConn, m Message) (Result, *smtpConn) {
	e, err := s.compose(m)
	if err != nil {
		return Result{Class: contract.ClassPermanent, Code: "message", Err: clip(err.Error())}, conn
	}
	return s.deliverEmail(ctx, conn, e)
}

// deliverEmail is deliver for an email already composed.
func (s *smtpSender) deliverEmail(ctx context.Context, conn *smtpConn, e *email) (Result, *smtpConn) {
	var err error
	pooled := conn != nil
	if conn == nil {
		if conn, err = s.dial(ctx); err != nil {
			return s.dialFailure(err), nil
		}
	}
	gate := sendGate(ctx)
	if !gateOpen(gate) {
		return GateClosed, conn
	}
	err = s.transmit(ctx, conn, e)
	if err != nil && pooled && ctx.Err() == nil && staleConn(err) {
		conn.close()
		if conn, err = s.dial(ctx); err != nil {
			return s.dialFailure(err), nil
		}
		if !gateOpen(gate) {
			return GateClosed, conn
		}
		err = s.transmit(ctx, conn, e)
	}
	if err == nil {
		return Result{Code: "250", ProviderID: e.id}, s.unlessCancelled(ctx, conn)
	}
	if ctx.Err() != nil {
		s.unlessCancelled(ctx, conn)
		return Result{Class: contract.ClassRetryable, Code: "timeout",
			Err: clip(redact("smtp: "+ctx.Err().Error()+": "+err.Error(), s.password))}, nil
	}
	r, keep := s.sendFailure(err)
	if !keep && conn != nil {
		conn.close()
		conn = nil
	}
	return r, conn
}

// unlessCancelled returns conn, or closes it and returns nil once ctx has
// ended: transmit may have closed the connection under the client.
func (s *smtpSender) unlessCancelled(ctx context.Context, conn *smtpConn) *smtpConn {
	if ctx.Err() == nil {
		return conn
	}
	conn.close()
	return nil
}

// transmit runs one mail transaction, a command at a time or pipelined
// when the server offers it (smtp_pipeline.go), with BDAT when it offers
// CHUNKING too (smtp_chunking.go); cancelling ctx closes the connection
// so a stuck server cannot hold the send past its deadline.
func (s *smtpSender) transmit(ctx context.Context, conn *smtpConn, e *email) error {
	stop := context.AfterFunc(ctx, conn.close)
	defer stop()
	if ok, _ := conn.Extension("PIPELINING"); ok {
		if ok, _ := conn.Extension("CHUNKING"); ok {
			return s.transmitChunked(conn, e)
		}
		return s.transmitPipelined(conn, e)
	}
	return s.transmitSerial(conn, e)
}

func (s *smtpSender) build(m Message) (*gomail.Msg, string, error) {
	msg := gomail.NewMsg(gomail.WithNoDefaultUserAgent())
	from := s.from
	msg.FromMailAddress(&from)
	if err := msg.To(m.To); err != nil {
		return nil, "", fmt.Errorf("recipient %q: %v", m.To, err)
	}
	msg.Subject(s.subject)
	id := messageID(m.ID, s.domain)
	msg.SetMessageIDWithValue(id)
	msg.SetDate()
	if s.html {
		msg.SetBodyString(gomail.TypeTextPlain, htmlToText(m.Body))
		msg.AddAlternativeString(gomail.TypeTextHTML, m.Body)
	} else {
		msg.SetBodyString(gomail.TypeTextPlain, m.Body)
	}
	return msg, id, nil
}

var msgIDUnsafe = regexp.MustCompile("[^A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]")

// msgIDUnsafeRune reports whether msgIDUnsafe matches r: a job id
// (ULIDs, digits, dots) seldom needs the regexp's replacement.
func msgIDUnsafeRune(r rune) bool {
	switch {
	case 'A' <= r && r <= 'Z', 'a' <= r && r <= 'z', '0' <= r && r <= '9':
		return false
	}
	return !strings.ContainsRune(".!#$%&'*+/=?^_`{|}~-", r)
}

// messageID builds the Message-ID (without brackets) from the job id.
func messageID(jobID, domain string) string {
	left := jobID
	if strings.IndexFunc(jobID, msgIDUnsafeRune) >= 0 {
		left = msgIDUnsafe.ReplaceAllString(jobID, "-")
	}
	left = strings.Trim(left, ".")
	if left == "" {
		left = "broadcast"
	}
	return left + "@" + domain
}

// smtpReply returns the SMTP reply code carried by err, or 0.
func smtpReply(err error) int {
	var se *gomail.SendError
	if errors.As(err, &se) {
		return se.ErrorCode()
	}
	var te *textproto.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// sendReason returns the step of the transaction that failed, from
// go-mail's error or a pipelined transaction's.
func sendReason(err error) (gomail.SendErrReason, bool) {
	var se *gomail.SendError
	if errors.As(err, &se) {
		return se.Reason, true
	}
	var pe *smtpStepError
	if errors.As(err, &pe) {
		return pe.reason, true
	}
	return 0, false
}

// staleConn reports whether err shows a pooled connection had died before
// the transaction began, so nothing was sent and a fresh connection may
// succeed.
func staleConn(err error) bool {
	reason, ok := sendReason(err)
	if !ok {
		return false
	}
	code := smtpReply(err)
	return reason == gomail.ErrConnCheck || (reason == gomail.ErrSMTPMailFrom && (code == 0 || code == 421))
}

func isAuthReply(code int) bool {
	return code == 530 || code == 534 || code == 535 || code == 538
}

// dialFailure classifies an error from connecting, greeting, STARTTLS or
// authenticating.
func (s *smtpSender) dialFailure(err error) Result {
	code := smtpReply(err)
	r := Result{Class: contract.ClassRetryable, Code: "network", Err: "smtp connect: " + err.Error()}
	var certErr *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case code >= 500:
		// Authentication failures (535 ...) and servers refusing this
		// client: nothing this account sends can get through.
		r.Class, r.Code = contract.ClassAccountFatal, strconv.Itoa(code)
	case code >= 400:
		r.Code = strconv.Itoa(code)
	case errors.As(err, &certErr), errors.As(err, &unknownCA), errors.As(err, &hostErr),
		errors.Is(err, smtp.ErrUnencrypted), errors.Is(err, smtp.ErrWrongHostname):
		r.Class, r.Code = contract.ClassAccountFatal, "tls"
	case errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		r.Code = "timeout"
	}
	r.Err = clip(redact(r.Err, s.password))
	return r
}

// sendFailure classifies an error from a mail transaction and says whether
// the connection is still fit for the next one.
func (s *smtpSender) sendFailure(err error) (Result, bool) {
	code := smtpReply(err)
	reason, _ := sendReason(err)
	r := Result{Code: strconv.Itoa(code), Err: clip(redact("smtp: "+err.Error(), s.password))}
	// After a failed DATA command the transaction is still open; only a
	// complete reply to RCPT, MAIL or the final dot leaves a clean session.
	var pe *smtpStepError
	keep := code != 0 && code != 421 && reason != gomail.ErrSMTPData && !(errors.As(err, &pe) && pe.broken)
	switch {
	case code == 0:
		r.Class, r.Code = contract.ClassRetryable, "network"
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			r.Code = "timeout"
		}
	case isAuthReply(code):
		r.Class, keep = contract.ClassAccountFatal, false
	case code >= 500 && reason == gomail.ErrSMTPMailFrom:
		r.Class = contract.ClassAccountFatal
	case code >= 500:
		r.Class = contract.ClassPermanent
	default:
		r.Class = contract.ClassRetryable
	}
	return r, keep
}

var (
	htmlDropped   = regexp.MustCompile(`(?is)<(script|style|head)\b.*?</(script|style|head)\s*>`)
	htmlBreak     = regexp.MustCompile(`(?i)<br\s*/?>|</?(p|div|h[1-6]|li|tr|ul|ol|table|blockquote|pre)\b[^>]*>`)
	htmlTag       = regexp.MustCompile(`(?s)<[^>]*>`)
	spaceRun      = regexp.MustCompile(`[ \t\r\f\v]+`)
	blankLinesRun = regexp.MustCompile(`\n{3,}`)
)

// htmlToText approximates the text of an HTML body for the plain-text
// alternative: block elements become line breaks, tags go, entities are
// decoded.
func htmlToText(s string) string {
	s = htmlDropped.ReplaceAllString(s, "")
	s = htmlBreak.ReplaceAllString(s, "\n")
	s = htmlTag.ReplaceAllString(s, "")
	s = html.UnescapeString(s)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(spaceRun.ReplaceAllString(l, " "))
	}
	return strings.TrimSpace(blankLinesRun.ReplaceAllString(strings.Join(lines, "\n"), "\n\n"))
}
