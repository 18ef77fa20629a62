package fakes

import (
	"net"
	"net/textproto"
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
// HELO, MAIL, RCPT, DATA, RSET, NOOP and QUIT on a loopback port, without
// TLS or AUTH.
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

func (s *SMTP) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	tp := textproto.NewConn(c)
	_ = tp.PrintfLine("220 fake ESMTP")
	var m Mail
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO", "HELO":
			_ = tp.PrintfLine("250-fake\r\n250 8BITMIME")
		case "MAIL":
			m = Mail{At: time.Now()}
			_ = tp.PrintfLine("250 Ok")
		case "RSET":
			m = Mail{}
			_ = tp.PrintfLine("250 Ok")
		case "NOOP":
			_ = tp.PrintfLine("250 Ok")
		case "RCPT":
			addr := strings.Trim(strings.TrimPrefix(arg, "TO:"), "<> ")
			if s.cfg.Rcpt != nil {
				if reply := s.cfg.Rcpt(addr); reply != "" {
					_ = tp.PrintfLine("%s", reply)
					continue
				}
			}
			m.To = append(m.To, addr)
			_ = tp.PrintfLine("250 Ok")
		case "DATA":
			_ = tp.PrintfLine("354 go ahead")
			if m.Data, err = tp.ReadDotBytes(); err != nil {
				return
			}
			reply := ""
			if s.cfg.Data != nil {
				reply = s.cfg.Data(m)
			}
			if reply != "" {
				_ = tp.PrintfLine("%s", reply)
			} else {
				s.mu.Lock()
				s.accepted++
				if !s.cfg.Discard {
					s.mails = append(s.mails, m)
				}
				s.mu.Unlock()
				_ = tp.PrintfLine("250 queued")
			}
			m = Mail{}
		case "QUIT":
			_ = tp.PrintfLine("221 bye")
			return
		default:
			_ = tp.PrintfLine("502 unknown")
		}
	}
}
