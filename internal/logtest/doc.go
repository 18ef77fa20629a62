// Package logtest holds the loggers tests give the code under test: Logger,
// quiet unless LOG_LEVEL asks for lines on stderr, and Buffer, which keeps
// what concurrent goroutines log so a test can read it. It imports nothing
// of Broadcast's, so any package's own tests may use it.
//
// Files:
//   - logger.go: Logger.
//   - buffer.go: Buffer.
package logtest
