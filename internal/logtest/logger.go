package logtest

import (
	"io"
	"log/slog"
	"os"
)

// Logger logs to stderr at LOG_LEVEL when it is set (for debugging a test),
// else nowhere.
func Logger() *slog.Logger {
	if lvl := os.Getenv("LOG_LEVEL"); lvl != "" {
		var l slog.Level
		_ = l.UnmarshalText([]byte(lvl))
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
