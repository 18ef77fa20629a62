package main

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/broadcastd/broadcast/internal/gateway"
)

func runGateway(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("gateway", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:9000", "listen address")
	var c gateway.Config
	fs.Float64Var(&c.FailRate, "fail-rate", 0, "share of requests answered 503")
	fs.Float64Var(&c.RateLimitedRate, "rate-limited-rate", 0, "share of requests answered 429")
	fs.DurationVar(&c.RetryAfter, "retry-after", time.Second, "Retry-After sent with 429s")
	fs.Float64Var(&c.TimeoutRate, "timeout-rate", 0, "share of requests that hang, then get 504")
	fs.DurationVar(&c.Hang, "hang", 15*time.Second, "how long hanging requests hang")
	fs.DurationVar(&c.Latency, "latency", 0, "latency added to every request")
	fs.StringVar(&c.PermanentPrefix, "permanent-prefix", "", "recipients with this prefix get 400")
	fs.StringVar(&c.FatalPrefix, "fatal-prefix", "", "recipients with this prefix get 401")
	fs.Float64Var(&c.RatePerSec, "rate", 0, "per-account limit; requests above it get 429 (0 = none)")
	fs.IntVar(&c.Burst, "burst", 1, "bucket size for -rate")
	secretEnv := fs.String("secret-env", "", "environment variable holding the signing secret to verify")
	fs.Uint64Var(&c.Seed, "seed", 0, "fault injection seed (0 = random)")
	fs.BoolVar(&c.Unauthorized, "unauthorized", false, "answer every send 401 (a revoked token)")
	fs.BoolVar(&c.NoRetryAfter, "no-retry-after", false, "send 429s without Retry-After")
	tapeFile := fs.String("tape", "", "play back this tape (broadcast tape -json TASK) before any other fault")
	_ = fs.Parse(args)
	if *tapeFile != "" {
		f, err := os.Open(*tapeFile)
		if err != nil {
			return err
		}
		c.Tape, err = gateway.ReadTape(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if *secretEnv != "" {
		c.Secret = getenv(*secretEnv)
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	return gateway.Serve(ctx, *addr, c, log)
}
