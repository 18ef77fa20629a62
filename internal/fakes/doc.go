// Package fakes holds the provider stand-ins that both the e2e tests and
// the scenario runner (internal/scenario) use, so each protocol is spoken
// by one piece of code. What a fake answers is its user's choice, through
// hooks; the fakes themselves only speak the protocol and keep what they
// accepted.
//
// Files:
//   - smtp.go: SMTP, a minimal SMTP server with hooks for RCPT and the
//     message (DATA or BDAT) that keeps the commands' order and offers
//     PIPELINING and CHUNKING (unless told not to).
//   - status.go: StatusRecorder, an http.ResponseWriter that keeps the
//     status a handler answered.
package fakes
