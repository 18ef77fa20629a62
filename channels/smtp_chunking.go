package channels

import (
	"bufio"
	"bytes"
	"strconv"

	gomail "github.com/wneessen/go-mail"
)

// transmitChunked runs one mail transaction for servers that announce
// CHUNKING (RFC 3030) beside PIPELINING (Postfix since 3.0 and Exim since
// 4.88 do by default): the message leaves as one BDAT chunk marked LAST,
// in the same write as MAIL and RCPT, and the three replies are read
// together. That is one round trip, one write and one read per message,
// where DATA needs a second round trip for its 354. BDAT's bytes are the
// message as it is, so there is no dot-stuffing either.
//
// A failure to read the first reply (the server closed an idle connection
// and never read the commands) is a MAIL step failure, as in the
// pipelined transaction, so the send is tried again at once on a fresh
// connection (staleConn): a server answers MAIL before it hangs up, and
// one that took the message and died before any reply is the same
// uncertainty as DATA's final reply lost. A refused MAIL or RCPT still has
// its BDAT read and refused by the server (RFC 3030, 2); any refusal
// resets the transaction.
func (s *smtpSender) transmitChunked(conn *smtpConn, e *email) error {
	if err := conn.UpdateDeadline(s.timeout); err != nil {
		return &smtpStepError{reason: gomail.ErrConnCheck, err: err}
	}
	t := conn.Text
	_, _ = t.W.WriteString(mailCommands(conn, e.from, e.to))
	writeChunk(t.W, e.data)
	if err := t.W.Flush(); err != nil {
		return &smtpStepError{reason: gomail.ErrSMTPMailFrom, err: err}
	}
	failed, _ := readReplies(t, replyStep{250, gomail.ErrSMTPMailFrom}, replyStep{25, gomail.ErrSMTPRcptTo},
		replyStep{250, gomail.ErrSMTPDataClose})
	if failed != nil {
		failed.broken = failed.broken || !abandonTransaction(t, false)
		return failed
	}
	return nil
}

// chunk is msg as one BDAT chunk carries it (crlfBuffer).
func chunk(msg *gomail.Msg) ([]byte, error) {
	var body crlfBuffer
	if _, err := msg.WriteTo(&body); err != nil {
		return nil, &smtpStepError{reason: gomail.ErrWriteContent, err: err}
	}
	body.end()
	return body.Bytes(), nil
}

// writeChunk writes body as the transaction's one BDAT chunk, marked LAST.
func writeChunk(w *bufio.Writer, body []byte) {
	_, _ = w.WriteString("BDAT " + strconv.Itoa(len(body)) + " LAST\r\n")
	_, _ = w.Write(body)
}

// crlfBuffer holds a message as BDAT sends it: every line ending CRLF (a
// bare LF, which DATA's dot-writer would turn into CRLF, gets its CR),
// the last line ended too.
type crlfBuffer struct {
	bytes.Buffer
	lastCR bool
}

func (b *crlfBuffer) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			b.Buffer.Write(p)
			b.lastCR = p[len(p)-1] == '\r'
			break
		}
		b.Buffer.Write(p[:i])
		if !(i > 0 && p[i-1] == '\r' || i == 0 && b.lastCR) {
			b.Buffer.WriteByte('\r')
		}
		b.Buffer.WriteByte('\n')
		b.lastCR = false
		p = p[i+1:]
	}
	return n, nil
}

// end ends the last line, as DATA's dot-writer does before the dot.
func (b *crlfBuffer) end() {
	if b.Len() > 0 && !bytes.HasSuffix(b.Bytes(), []byte("\r\n")) {
		b.Buffer.WriteString("\r\n")
	}
}
