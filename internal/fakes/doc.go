// Package fakes holds the provider stand-ins that both the e2e tests and
// the scenario runner (internal/scenario) use, so each protocol is spoken
// by one piece of code. What a fake answers is its user's choice, through
// hooks; the fakes themselves only speak the protocol and keep what they
// accepted.
//
// Files:
//   - smtp.go: SMTP, a minimal SMTP server in Postfix's words, with
//     hooks for MAIL, RCPT and the message (DATA or BDAT), AUTH PLAIN,
//     and the quirks a sender must survive (a refusing greeting, hang-ups
//     after some messages, a 421 ending a session, a message never
//     answered, DATA accepted with no recipient); it keeps the commands'
//     order, offers PIPELINING and CHUNKING (unless told not to) and
//     counts connections, transactions, pipelined groups, BDATs, RSETs
//     and QUITs. The channels package's tests and the benchmark sink use
//     it too.
//   - status.go: StatusRecorder, an http.ResponseWriter that keeps the
//     status a handler answered.
package fakes
