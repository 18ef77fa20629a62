package channels

import (
	"bufio"
	"bytes"
	"fmt"
	"mime/quotedprintable"
	"net/mail"
	"strings"
	"time"

	gomail "github.com/wneessen/go-mail"
)

// email is a message ready for its transaction: the envelope, and the
// content as the server stores it (CRLF line ends, the last line ended).
// m is kept for a server without PIPELINING, whose transaction go-mail
// runs from its own message (transmit).
type email struct {
	m        Message
	id       string // Message-ID, without brackets
	from, to string // envelope addresses
	data     []byte
}

// compose builds m's email. A plain-text message to a bare address is
// written here, byte for byte as go-mail writes it, with the headers that
// are the account's (Subject, From) written by go-mail once per sender
// (plainHeaders); go-mail builds the rest. Building each message with
// go-mail cost about a third of the sender's CPU per email with several
// transactions a write (maps, header sorting and folding per message).
func (s *smtpSender) compose(m Message) (*email, error) {
	if s.plainHeaders != nil {
		addr, err := mail.ParseAddress(m.To)
		if err != nil {
			return nil, fmt.Errorf("recipient %q: %v", m.To, err)
		}
		if addr.Name == "" && !strings.ContainsAny(addr.Address, "\r\n") {
			return s.composePlain(m, addr.Address), nil
		}
	}
	msg, id, err := s.build(m)
	if err != nil {
		return nil, err
	}
	e := &email{m: m, id: id}
	if e.from, e.to, err = envelope(msg); err != nil {
		return nil, err
	}
	if e.data, err = chunk(msg); err != nil {
		return nil, err
	}
	return e, nil
}

// composePlain writes a plain-text email to the bare address addr.
func (s *smtpSender) composePlain(m Message, addr string) *email {
	id := messageID(m.ID, s.domain)
	to := (&mail.Address{Address: addr}).String() // <addr>, as go-mail writes it
	var b crlfBuffer
	b.Grow(len(s.plainHeaders) + len(id) + len(to) + len(m.Body) + len(m.Body)/8 + 160)
	b.Buffer.WriteString("Date: ")
	b.Buffer.WriteString(time.Now().Format(time.RFC1123Z))
	b.Buffer.WriteString("\r\nMIME-Version: 1.0\r\nMessage-ID: <")
	b.Buffer.WriteString(id)
	b.Buffer.WriteString(">\r\n")
	b.Buffer.Write(s.plainHeaders)
	b.Buffer.WriteString("To: ")
	b.Buffer.WriteString(to)
	b.Buffer.WriteString("\r\nContent-Transfer-Encoding: quoted-printable\r\nContent-Type: text/plain; charset=UTF-8\r\n\r\n")
	qp := quotedprintable.NewWriter(&b)
	_, _ = qp.Write([]byte(m.Body))
	_ = qp.Close()
	b.end()
	return &email{m: m, id: id, from: (&mail.Address{Address: s.from.Address}).String(), to: to, data: b.Bytes()}
}

// accountHeaders returns the Subject and From fields go-mail writes for
// this sender's plain-text messages, each with its folded lines, CRLF
// ended, for composePlain.
func (s *smtpSender) accountHeaders() ([]byte, error) {
	msg := gomail.NewMsg(gomail.WithNoDefaultUserAgent())
	from := s.from
	msg.FromMailAddress(&from)
	msg.Subject(s.subject)
	msg.SetBodyString(gomail.TypeTextPlain, "x")
	var b crlfBuffer
	if _, err := msg.WriteTo(&b); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	keep := false
	lines := bufio.NewScanner(&b)
	for lines.Scan() {
		line := lines.Text()
		switch {
		case line == "":
			return out.Bytes(), nil
		case line[0] == ' ' || line[0] == '\t':
		default:
			keep = strings.HasPrefix(line, "Subject:") || strings.HasPrefix(line, "From:")
		}
		if keep {
			out.WriteString(strings.TrimSuffix(line, "\r"))
			out.WriteString("\r\n")
		}
	}
	return nil, fmt.Errorf("go-mail wrote no header end")
}
