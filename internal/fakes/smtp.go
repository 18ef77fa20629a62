package fakes

import (
	"bytes"
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
}

// Mail is one message an SMTP fake received.
type Mail struct {
	// At is when the transaction's MAIL command arrived.
	At time.Time
	// To are the recipients RCPT accepted.
	To   []string
	Data []byte
}

// SMTP is just enough of an SMTP server for a sender under test: EHLO,
// HELO, MAIL, RCPT, DATA, BDAT, RSET, NOOP and QUIT on a loopback port,
// without TLS or AUTH. Like a real server it keeps the commands' order (RCPT
// needs MAIL, DATA an accepted recipient) and, with pipelining, holds its
// replies until it has answered every command already received, so a
// pipelined group's replies leave in one write.
type SMTP struct {
	cfg SMTPConfig
	ln  net.Listener
	wg  sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]bool
	count    int
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
			s.count++
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
func (s *SMTP) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
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

// messageEnd answers a message's end: the Data hook's refusal, or it is
// accepted and kept.
func (s *SMTP) messageEnd(m Mail) string {
	if s.cfg.Data != nil {
		if answer := s.cfg.Data(m); answer != "" {
			return answer
		}
	}
	s.mu.Lock()
	s.accepted++
	if !s.cfg.Discard {
		s.mails = append(s.mails, m)
	}
	s.mu.Unlock()
	return "250 queued"
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
	ehlo := "250-fake\r\n"
	if !s.cfg.NoPipelining {
		ehlo += "250-PIPELINING\r\n"
	}
	if !s.cfg.NoChunking {
		ehlo += "250-CHUNKING\r\n"
	}
	ehlo += "250 8BITMIME"
	reply("220 fake ESMTP")
	var m Mail
	inMail := false
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO", "HELO":
			m, inMail = Mail{}, false
			reply(ehlo)
		case "MAIL":
			if inMail {
				reply("503 5.5.1 Error: nested MAIL command")
				continue
			}
			m, inMail = Mail{At: time.Now()}, true
			reply("250 Ok")
		case "RSET":
			m, inMail = Mail{}, false
			reply("250 Ok")
		case "NOOP":
			reply("250 Ok")
		case "RCPT":
			if !inMail {
				reply("503 5.5.1 Error: need MAIL command")
				continue
			}
			addr := strings.Trim(strings.TrimPrefix(arg, "TO:"), "<> ")
			if s.cfg.Rcpt != nil {
				if r := s.cfg.Rcpt(addr); r != "" {
					reply(r)
					continue
				}
			}
			m.To = append(m.To, addr)
			reply("250 Ok")
		case "DATA":
			if !inMail {
				reply("503 5.5.1 Error: need RCPT command")
				continue
			}
			if len(m.To) == 0 {
				reply("554 5.5.1 Error: no valid recipients")
				continue
			}
			reply("354 go ahead")
			if m.Data, err = tp.ReadDotBytes(); err != nil {
				return
			}
			reply(s.messageEnd(m))
			m, inMail = Mail{}, false
		case "BDAT":
			// One chunk marked LAST, read even after a refusal (RFC 3030,
			// 2); kept with LF line ends, as DATA's are.
			size, last, _ := strings.Cut(arg, " ")
			n, err := strconv.Atoi(size)
			if s.cfg.NoChunking || err != nil || n < 0 || n > maxChunk || !strings.EqualFold(last, "LAST") {
				reply("501 5.5.4 Syntax: BDAT count LAST")
				return
			}
			chunk := make([]byte, n)
			if _, err := io.ReadFull(tp.R, chunk); err != nil {
				return
			}
			switch {
			case !inMail:
				reply("503 5.5.1 Error: need MAIL command")
			case len(m.To) == 0:
				reply("554 5.5.1 Error: no valid recipients")
			default:
				m.Data = bytes.ReplaceAll(chunk, []byte("\r\n"), []byte("\n"))
				reply(s.messageEnd(m))
			}
			m, inMail = Mail{}, false
		case "QUIT":
			reply("221 bye")
			return
		default:
			reply("502 unknown")
		}
	}
}
