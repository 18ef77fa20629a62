package shared

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
)

// Log attribute keys, defined once so every service's lines can be joined.
const (
	KeyTaskID  = "task_id"
	KeyJobID   = "job_id"
	KeyAccount = "account"
	KeyAttempt = "attempt"
	KeySubject = "subject"
	KeySeq     = "seq"
	KeyService = "service"
	KeyClass   = "class"
	KeyTo      = "to"
)

// LogConfig selects the log format and level.
type LogConfig struct {
	// Format is "text" (coloured, via tint) or "json". Defaults to text.
	Format string
	// Level is debug, info, warn or error. Defaults to info.
	Level string
}

// LogConfigFromEnv reads LOG_FORMAT and LOG_LEVEL.
func LogConfigFromEnv() LogConfig {
	return LogConfig{Format: os.Getenv("LOG_FORMAT"), Level: os.Getenv("LOG_LEVEL")}
}

// NewLogger builds the logger services receive; nothing logs globally.
func NewLogger(w io.Writer, c LogConfig) (*slog.Logger, error) {
	var level slog.Level
	if c.Level != "" {
		if err := level.UnmarshalText([]byte(c.Level)); err != nil {
			return nil, fmt.Errorf("LOG_LEVEL: %q is not debug, info, warn or error", c.Level)
		}
	}
	switch strings.ToLower(c.Format) {
	case "", "text":
		return slog.New(tint.NewHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly, NoColor: !isTerminal(w)})), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})), nil
	}
	return nil, fmt.Errorf("LOG_FORMAT: %q is not text or json", c.Format)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func slogValue(v any) string { return fmt.Sprint(v) }
