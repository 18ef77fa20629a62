package fakes

import (
	"bytes"
	"encoding/base64"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SMTPConfig chooses what an SMTP fake answers. The zero value accepts
// every recipient and every message.
type SMTPConfig struct {
	// Rcpt, when set, answers RCPT TO for addr: a reply line such as
	// "550 5.1.1 mailbox unavailable" refuses the address, "" accepts it.
	Rcpt func(addr string) string
	// Data, when set, answers a message: a reply line such as
	// "451 4.3.0 try again later" refuses it, "" accepts it (it is kept
	// and answered "250 queued").
	Data func(m Mail) string
	// Discard counts accepted messages without keeping them, for long
	// benchmark runs; Received is then empty.
	Discard bool
	// NoPipelining leaves PIPELINING (RFC 2920) out of the EHLO reply,
	// as a server without it would; by default it is offered, as
	// Postfix and Exim do by default.
	NoPipelining bool
	// NoChunking leaves CHUNKING (RFC 3030: BDAT) out of the EHLO reply;
	// by default it is offered, as Postfix (since 3.0) and Exim (since
	// 4.88) do by default.
	NoChunking bool
	// User, when set, offers AUTH PLAIN and takes User with Password;
	// other credentials get 535.
	User, Password string
	// Greeting, when set, is all the server says to a connection before
	// it hangs up: a 421 or 554 refusing service.
	Greeting string
	// MailFrom, when set, answers MAIL FROM for addr: a reply line
	// refuses the transaction, "" lets it go on.
	MailFrom func(addr string) string
	// CloseAfter hangs up after a connection's CloseAfter-th accepted
	// message, as a server's idle timeout would, without a word.
	CloseAfter int
	// RefuseAfter answers the MAIL after a connection's RefuseAfter
	// messages with 421 and hangs up, as a server ending a session does.
	RefuseAfter int
	// GreetDelay holds each connection's greeting that long, as a loaded
	// server (or one whose accept queue is full) keeps a client waiting
	// before it can send.
	GreetDelay time.Duration
	// LenientData answers DATA with 354 when no recipient was accepted
	// (the quirk RFC 2920 section 3.1 tells clients to expect) and refuses
	// the message that follows.
	LenientData bool
}

// SMTPStall, answered by SMTPConfig.Data, leaves the message without a
// reply: the connection stays open until the client hangs up.
const SMTPStall = "stall"

// SMTPCounts counts what an SMTP fake saw, over all its connections.
type SMTPCounts struct {
	// Connections accepted.
	Connections int
	// Transactions are MAIL commands.
	Transactions int
	// Pipelined are MAIL commands that arrived with the next command
	// already in the same read.
	Pipelined int
	// Chunks are BDAT commands.
	Chunks int
	Resets int
	// Noops are NOOP commands (a client checking its connection first).
	Noops int
	Quits int
}

// Mail is one message an SMTP fake received.
type Mail struct {
	// At is when the transaction's MAIL command arrived.
	At   time.Time
	From string
	// To are the recipients RCPT accepted.
	To   []string
	Data []byte
}

// SMTP is just enough of an SMTP server for a sender under test: EHLO,
// HELO, AUTH PLAIN, MAIL, RCPT, DATA, BDAT, RSET, NOOP and QUIT on a
// loopback port, without TLS. Like a real server it keeps the commands'
// order (RCPT needs MAIL, DATA an accepted recipient), answers in
// Postfix's words, and holds its replies until it has answered every
// command already received, so a pipelined group's replies leave in one
// write.
type SMTP struct {
	cfg SMTPConfig
	ln  net.Listener
	wg  sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]bool
	counts   SMTPCounts
	accepted int
	mails    []Mail
}

// StartSMTP listens on a free loopback port and serves until Close.
func StartSMTP(cfg SMTPConfig) (*SMTP, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &SMTP{cfg: cfg, ln: ln, conns: map[net.Conn]bool{}}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = true
			s.counts.Connections++
			s.mu.Unlock()
			s.wg.Go(func() { s.serve(c) })
		}
	})
	return s, nil
}

// Addr is host:port.
func (s *SMTP) Addr() string { return s.ln.Addr().String() }

// Port is the port it listens on.
func (s *SMTP) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Received returns the messages accepted so far, in order.
func (s *SMTP) Received() []Mail {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Mail(nil), s.mails...)
}

// Accepted counts the messages accepted so far, kept or discarded.
func (s *SMTP) Accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// Connections counts the connections accepted so far.
func (s *SMTP) Connections() int { return s.Counts().Connections }

// Counts returns what the server saw so far.
func (s *SMTP) Counts() SMTPCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// count adds one to the count c picks.
func (s *SMTP) count(c func(*SMTPCounts) *int) {
	s.mu.Lock()
	*c(&s.counts)++
	s.mu.Unlock()
}

// Close stops listening, closes every connection and waits for them.
func (s *SMTP) Close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// maxChunk bounds a BDAT chunk the fake reads, as a server's message size
// limit would (Postfix's message_size_limit defaults to 10,240,000).
const maxChunk = 10240000

// messageEnd answers a message's end: the Data hook's refusal (or
// SMTPStall), or it is accepted and kept, and reports whether it was.
func (s *SMTP) messageEnd(m Mail) (string, bool) {
	if s.cfg.Data != nil {
		if answer := s.cfg.Data(m); answer != "" {
			return answer, false
		}
	}
	s.mu.Lock()
	s.accepted++
	n := s.accepted
	if !s.cfg.Discard {
		s.mails = append(s.mails, m)
	}
	s.mu.Unlock()
	return "250 2.0.0 Ok: queued as Q" + strconv.Itoa(n), true
}

// ehlo is the server's EHLO reply.
func (s *SMTP) ehlo() string {
	lines := []string{"250-fake", "250-8BITMIME", "250-ENHANCEDSTATUSCODES"}
	if !s.cfg.NoPipelining {
		lines = append(lines, "250-PIPELINING")
	}
	if !s.cfg.NoChunking {
		lines = append(lines, "250-CHUNKING")
	}
	if s.cfg.User != "" {
		lines = append(lines, "250-AUTH PLAIN")
	}
	return strings.Join(append(lines, "250 SIZE 10240000"), "\r\n")
}

// authPlain reports whether an AUTH argument is PLAIN with the
// configured credentials.
func (s *SMTP) authPlain(arg string) bool {
	mech, b64, _ := strings.Cut(arg, " ")
	raw, _ := base64.StdEncoding.DecodeString(b64)
	parts := strings.Split(string(raw), "\x00")
	return s.cfg.User != "" && strings.EqualFold(mech, "PLAIN") && len(parts) == 3 &&
		parts[1] == s.cfg.User && parts[2] == s.cfg.Password
}

// addrArg is the address of "FROM:<a@b> BODY=8BITMIME".
func addrArg(arg string) string {
	start, end := strings.IndexByte(arg, '<'), strings.IndexByte(arg, '>')
	if start < 0 || end < start {
		return ""
	}
	return arg[start+1 : end]
}

func (s *SMTP) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	tp := textproto.NewConn(c)
	// reply writes one reply and sends what is written once no command
	// waits to be read.
	reply := func(line string) {
		_, _ = tp.W.WriteString(line)
		_, _ = tp.W.WriteString("\r\n")
		if tp.R.Buffered() == 0 {
			_ = tp.W.Flush()
		}
	}
	time.Sleep(s.cfg.GreetDelay)
	if s.cfg.Greeting != "" {
		reply(s.cfg.Greeting)
		return
	}
	reply("220 fake ESMTP")
	var m Mail
	inMail, rcptSeen := false, false
	delivered := 0
	// end answers a message's end and reports whether the session goes on.
	end := func() bool {
		answer, ok := s.messageEnd(m)
		m, inMail = Mail{}, false
		if answer == SMTPStall {
			return true // the next read ends when the client hangs up
		}
		reply(answer)
		if ok {
			delivered++
		}
		if s.cfg.CloseAfter > 0 && delivered >= s.cfg.CloseAfter {
			_ = tp.W.Flush() // what it answered goes out before it hangs up
			return false
		}
		return true
	}
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			m, inMail = Mail{}, false
			reply(s.ehlo())
		case "HELO":
			m, inMail = Mail{}, false
			reply("250 fake")
		case "AUTH":
			if s.authPlain(arg) {
				reply("235 2.7.0 Authentication successful")
			} else {
				reply("535 5.7.8 Authentication credentials invalid")
			}
		case "MAIL":
			if tp.R.Buffered() > 0 {
				s.count(func(c *SMTPCounts) *int { return &c.Pipelined })
			}
			if inMail {
				reply("503 5.5.1 Error: nested MAIL command")
				continue
			}
			if s.cfg.RefuseAfter > 0 && delivered >= s.cfg.RefuseAfter {
				reply("421 4.4.2 fake Error: timeout exceeded, closing")
				_ = tp.W.Flush() // said before hanging up
				return
			}
			s.count(func(c *SMTPCounts) *int { return &c.Transactions })
			from := addrArg(arg)
			if s.cfg.MailFrom != nil {
				if r := s.cfg.MailFrom(from); r != "" {
					reply(r)
					continue
				}
			}
			m, inMail, rcptSeen = Mail{At: time.Now(), From: from}, true, false
			reply("250 2.1.0 Ok")
		case "RSET":
			s.count(func(c *SMTPCounts) *int { return &c.Resets })
			m, inMail = Mail{}, false
			reply("250 2.0.0 Ok")
		case "NOOP":
			s.count(func(c *SMTPCounts) *int { return &c.Noops })
			reply("250 2.0.0 Ok")
		case "RCPT":
			if !inMail {
				reply("503 5.5.1 Error: need MAIL command")
				continue
			}
			rcptSeen = true
			addr := addrArg(arg)
			if s.cfg.Rcpt != nil {
				if r := s.cfg.Rcpt(addr); r != "" {
					reply(r)
					continue
				}
			}
			m.To = append(m.To, addr)
			reply("250 2.1.5 Ok")
		case "DATA":
			// Postfix's answers: no RCPT at all, or none accepted.
			if !inMail || !rcptSeen {
				reply("503 5.5.1 Error: need RCPT command")
				continue
			}
			if len(m.To) == 0 && !s.cfg.LenientData {
				reply("554 5.5.1 Error: no valid recipients")
				continue
			}
			reply("354 End data with <CR><LF>.<CR><LF>")
			if m.Data, err = tp.ReadDotBytes(); err != nil {
				return
			}
			if len(m.To) == 0 {
				reply("554 5.5.1 Error: no valid recipients")
				m, inMail = Mail{}, false
				continue
			}
			if !end() {
				return
			}
		case "BDAT":
			// One chunk marked LAST, read even after a refusal (RFC 3030,
			// 2); kept with LF line ends, as DATA's are.
			size, last, _ := strings.Cut(arg, " ")
			n, err := strconv.Atoi(size)
			if s.cfg.NoChunking || err != nil || n < 0 || n > maxChunk || !strings.EqualFold(last, "LAST") {
				reply("501 5.5.4 Syntax: BDAT count LAST")
				return
			}
			s.count(func(c *SMTPCounts) *int { return &c.Chunks })
			chunk := make([]byte, n)
			if _, err := io.ReadFull(tp.R, chunk); err != nil {
				return
			}
			switch {
			case !inMail:
				reply("503 5.5.1 Error: need MAIL command")
			case len(m.To) == 0:
				reply("554 5.5.1 Error: no valid recipients")
				m, inMail = Mail{}, false
			default:
				m.Data = bytes.ReplaceAll(chunk, []byte("\r\n"), []byte("\n"))
				if !end() {
					return
				}
			}
		case "QUIT":
			s.count(func(c *SMTPCounts) *int { return &c.Quits })
			reply("221 2.0.0 Bye")
			return
		default:
			reply("502 5.5.2 Error: command not recognized")
		}
	}
}
