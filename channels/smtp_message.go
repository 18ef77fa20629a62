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
// Every transaction (serial, pipelined, BDAT) sends these bytes.
type email struct {
	id       string // Message-ID, without brackets
	from, to string // envelope addresses
	data     []byte
}

// compose builds m's email. A plain-text message to a bare address is
// written here, byte for byte as go-mail writes it, with the headers that
// are the account's (Subject, From) written by go-mail once per sender
// (plainHeaders), as long as its To and Message-ID fit one line as go-mail
// folds them; go-mail builds the rest. Building each message with
// go-mail cost about a third of the sender's CPU per email with several
// transactions a write (maps, header sorting and folding per message).
func (s *smtpSender) compose(m Message) (*email, error) {
	if s.plainHeaders != nil {
		addr := m.To
		if !dotAtomAddress(addr) {
			parsed, err := mail.ParseAddress(m.To)
			if err != nil {
				return nil, fmt.Errorf("recipient %q: %v", m.To, err)
			}
			if parsed.Name != "" || strings.ContainsAny(parsed.Address, "\r\n") {
				addr = ""
			} else {
				addr = parsed.Address
			}
		}
		if addr != "" {
			if e := s.composePlain(m, addr); e != nil {
				return e, nil
			}
		}
	}
	msg, id, err := s.build(m)
	if err != nil {
		return nil, err
	}
	e := &email{id: id}
	if e.from, e.to, err = envelope(msg); err != nil {
		return nil, err
	}
	if e.data, err = chunk(msg); err != nil {
		return nil, err
	}
	return e, nil
}

// composePlain writes a plain-text email to the bare address addr, or
// returns nil when go-mail would fold its To or Message-ID field.
func (s *smtpSender) composePlain(m Message, addr string) *email {
	id := messageID(m.ID, s.domain)
	to := (&mail.Address{Address: addr}).String() // <addr>, as go-mail writes it
	if !oneLineHeader("To", to) || !oneLineHeader("Message-ID", "<"+id+">") {
		return nil
	}
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
	return &email{id: id, from: s.envelopeFrom, to: to, data: b.Bytes()}
}

// oneLineHeader reports whether go-mail writes the field key: value on
// one line: a value without spaces that leaves more than one character of
// its line length (msgWriter.writeHeader).
func oneLineHeader(key, value string) bool {
	return !strings.Contains(value, " ") && gomail.MaxHeaderLength-2-len(key)-2-len(value) > 1
}

// dotAtomAddress reports whether addr is local@domain with both parts
// dot-atoms (RFC 5322 atext runs joined by single dots), as recipients
// are once render has normalised them: net/mail parses such an address
// to itself and writes it unquoted, so compose need not parse it.
func dotAtomAddress(addr string) bool {
	at := strings.IndexByte(addr, '@')
	return at > 0 && dotAtom(addr[:at]) && dotAtom(addr[at+1:])
}

func dotAtom(s string) bool {
	if s == "" || s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c != '.' && !atext(c) {
			return false
		}
	}
	return true
}

// atext is RFC 5322's atext, ASCII only.
func atext(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0
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
