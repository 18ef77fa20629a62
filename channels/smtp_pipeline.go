package channels

import (
	"errors"
	"net/textproto"
	"strings"

	gomail "github.com/wneessen/go-mail"
)

// transmitPipelined runs one mail transaction with command pipelining
// (RFC 2920), for servers that announce PIPELINING: MAIL, RCPT and DATA
// leave in one write and their replies are read in order, then the
// message and its final dot. That is two round trips per message where
// the serial transaction takes four (transmitSerial), which halves the
// time a connection spends per message on a distant server and the
// system calls on both ends on a near one.
//
// Errors carry the step that failed in go-mail's terms (smtpStepError),
// so staleConn and sendFailure classify every path alike. A refused MAIL
// or RCPT leaves the session as it found it: the replies to the commands
// after it are read, a DATA the server went ahead with anyway gets an
// empty message's end (RFC 2920, 3.1) and the transaction is reset.
func (s *smtpSender) transmitPipelined(conn *smtpConn, e *email) error {
	cmds := mailCommands(conn, e.from, e.to)
	if err := conn.UpdateDeadline(s.timeout); err != nil {
		return &smtpStepError{reason: gomail.ErrConnCheck, err: err}
	}
	t := conn.Text
	if _, err := t.W.WriteString(cmds + "DATA\r\n"); err != nil {
		return &smtpStepError{reason: gomail.ErrSMTPMailFrom, err: err}
	}
	if err := t.W.Flush(); err != nil {
		return &smtpStepError{reason: gomail.ErrSMTPMailFrom, err: err}
	}
	failed, inData := readReplies(t, replyStep{250, gomail.ErrSMTPMailFrom}, replyStep{25, gomail.ErrSMTPRcptTo},
		replyStep{354, gomail.ErrSMTPData})
	if failed != nil {
		if !failed.broken && failed.reason != gomail.ErrSMTPData {
			failed.broken = !abandonTransaction(t, inData)
		}
		return failed
	}
	return writeData(t, e.data)
}

// writeData writes a message after the server's 354 to DATA, then its
// final dot, and reads the reply to it.
func writeData(t *textproto.Conn, data []byte) error {
	dw := t.DotWriter()
	if _, err := dw.Write(data); err != nil {
		return &smtpStepError{reason: gomail.ErrWriteContent, err: err, broken: true}
	}
	if err := dw.Close(); err != nil {
		return &smtpStepError{reason: gomail.ErrSMTPDataClose, err: err}
	}
	if _, _, err := t.ReadResponse(250); err != nil {
		return &smtpStepError{reason: gomail.ErrSMTPDataClose, err: err}
	}
	return nil
}

// transmitSerial runs one mail transaction a command at a time, for
// servers without PIPELINING: MAIL, RCPT and DATA each wait for their
// reply, then the message and its final dot. It sends the email compose
// wrote, as the other transactions do (go-mail's own transaction would
// build the message again from its parts). A refused MAIL or RCPT is
// followed by RSET, so the session stays usable.
func (s *smtpSender) transmitSerial(conn *smtpConn, e *email) error {
	if err := conn.UpdateDeadline(s.timeout); err != nil {
		return &smtpStepError{reason: gomail.ErrConnCheck, err: err}
	}
	t := conn.Text
	cmds := mailCommands(conn, e.from, e.to)
	rcpt := strings.Index(cmds, "RCPT TO:")
	for _, c := range []struct {
		cmd  string
		step replyStep
	}{
		{cmds[:rcpt], replyStep{250, gomail.ErrSMTPMailFrom}},
		{cmds[rcpt:], replyStep{25, gomail.ErrSMTPRcptTo}},
		{"DATA\r\n", replyStep{354, gomail.ErrSMTPData}},
	} {
		if _, err := t.W.WriteString(c.cmd); err != nil {
			return &smtpStepError{reason: c.step.reason, err: err, broken: true}
		}
		if err := t.W.Flush(); err != nil {
			return &smtpStepError{reason: c.step.reason, err: err, broken: true}
		}
		if _, _, err := t.ReadResponse(c.step.expect); err != nil {
			failed := &smtpStepError{reason: c.step.reason, err: err, broken: !isReply(err)}
			if !failed.broken && failed.reason != gomail.ErrSMTPData {
				failed.broken = !abandonTransaction(t, false)
			}
			return failed
		}
	}
	return writeData(t, e.data)
}

// replyStep is a reply a pipelined group of commands expects and the step
// of the transaction it answers.
type replyStep struct {
	expect int
	reason gomail.SendErrReason
}

// readReplies reads the replies to a pipelined group of commands, in
// order. The first refusal is the group's result. A failure to read a
// reply (not an SMTP reply) leaves nothing more to read: the session is
// done (broken), and the result is the refusal before it if there was one
// (a 421 to MAIL, then the server hangs up). lastOK says the last step's
// reply was a success (a 354 to DATA).
func readReplies(t *textproto.Conn, steps ...replyStep) (failed *smtpStepError, lastOK bool) {
	for _, step := range steps {
		_, _, err := t.ReadResponse(step.expect)
		switch {
		case err == nil:
			lastOK = true
			continue
		case !isReply(err):
			if failed == nil {
				failed = &smtpStepError{reason: step.reason, err: err}
			}
			failed.broken = true
			return failed, false
		case failed == nil:
			failed = &smtpStepError{reason: step.reason, err: err}
		}
		lastOK = false
	}
	return failed, lastOK
}

// envelope is msg's sender and its one recipient, checked for line breaks.
func envelope(msg *gomail.Msg) (from, rcpt string, err error) {
	from, err = msg.GetSender(false)
	if err != nil {
		return "", "", &smtpStepError{reason: gomail.ErrGetSender, err: err}
	}
	rcpts, err := msg.GetRecipients()
	if err != nil {
		return "", "", &smtpStepError{reason: gomail.ErrGetRcpts, err: err}
	}
	if len(rcpts) != 1 || strings.ContainsAny(from+rcpts[0], "\r\n") {
		return "", "", &smtpStepError{reason: gomail.ErrGetRcpts, err: errors.New("want one recipient and addresses without line breaks")}
	}
	return from, rcpts[0], nil
}

// mailCommands are the MAIL and RCPT commands for from and rcpt, each
// line ended, with the parameters conn's server announced.
func mailCommands(conn *smtpConn, from, rcpt string) string {
	var cmds strings.Builder
	cmds.Grow(len("MAIL FROM: BODY=8BITMIME SMTPUTF8\r\nRCPT TO:\r\n") + len(from) + len(rcpt))
	cmds.WriteString("MAIL FROM:")
	cmds.WriteString(from)
	if ok, _ := conn.Extension("8BITMIME"); ok {
		cmds.WriteString(" BODY=8BITMIME")
	}
	if ok, _ := conn.Extension("SMTPUTF8"); ok {
		cmds.WriteString(" SMTPUTF8")
	}
	cmds.WriteString("\r\nRCPT TO:")
	cmds.WriteString(rcpt)
	cmds.WriteString("\r\n")
	return cmds.String()
}

// abandonTransaction ends a transaction whose MAIL or RCPT was refused:
// the end of an empty message when the server answered DATA with 354
// regardless, then RSET. It reports whether the session is clean.
func abandonTransaction(t *textproto.Conn, inData bool) bool {
	cmds := "RSET\r\n"
	if inData {
		cmds = ".\r\n" + cmds
	}
	if _, err := t.W.WriteString(cmds); err != nil || t.W.Flush() != nil {
		return false
	}
	if inData {
		if _, _, err := t.ReadResponse(0); err != nil && !isReply(err) {
			return false
		}
	}
	_, _, err := t.ReadResponse(250)
	return err == nil
}

// isReply reports whether err is an SMTP reply, as opposed to a failure
// to read one.
func isReply(err error) bool {
	var te *textproto.Error
	return errors.As(err, &te)
}

// smtpStepError is a failed step of a pipelined transaction. broken says
// the session is out of step with the server, so the connection must go
// whatever the reply.
type smtpStepError struct {
	reason gomail.SendErrReason
	err    error
	broken bool
}

func (e *smtpStepError) Error() string { return e.reason.String() + ": " + e.err.Error() }

func (e *smtpStepError) Unwrap() error { return e.err }
