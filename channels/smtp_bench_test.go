//go:build unix

package channels

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/internal/fakes"
)

// smtpSinkChildEnv makes TestSMTPBenchSink serve instead of skipping:
// "chunked" offers PIPELINING and CHUNKING, "pipelined" PIPELINING only,
// "serial" neither.
const smtpSinkChildEnv = "BROADCAST_SMTP_BENCH_SINK"

// TestSMTPBenchSink is the benchmark's SMTP server when the test binary
// runs itself as a child (smtpBenchSink): the fake of internal/fakes,
// discarding messages, in its own process so that the benchmark's own
// CPU time is the client's alone. It prints "addr HOST:PORT", then answers
// each line "cpu" on stdin with "cpu NS ACCEPTED" (its user+system CPU
// time and the messages it accepted), and exits when stdin closes.
func TestSMTPBenchSink(t *testing.T) {
	mode := os.Getenv(smtpSinkChildEnv)
	if mode != "chunked" && mode != "pipelined" && mode != "serial" {
		t.Skip("the SMTP benchmark's child process")
	}
	sink, err := fakes.StartSMTP(fakes.SMTPConfig{Discard: true, NoPipelining: mode == "serial", NoChunking: mode != "chunked"})
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	fmt.Printf("addr %s\n", sink.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			fmt.Printf("cpu %d %d\n", cpuTime(syscall.RUSAGE_SELF), sink.Accepted())
		}
	}
}

// cpuTime is user+system CPU time in nanoseconds.
func cpuTime(who int) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// smtpBenchSink is the child process serving TestSMTPBenchSink.
type smtpBenchSink struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	port int
}

func startSMTPBenchSink(b *testing.B, mode string) *smtpBenchSink {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSMTPBenchSink$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), smtpSinkChildEnv+"="+mode)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	s := &smtpBenchSink{cmd: cmd, in: in, out: bufio.NewScanner(stdout)}
	b.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Wait()
	})
	if !s.out.Scan() {
		b.Fatal("smtp sink: no address")
	}
	_, addr, _ := strings.Cut(s.out.Text(), "addr ")
	_, port, _ := strings.Cut(addr, ":")
	if s.port, err = strconv.Atoi(port); err != nil {
		b.Fatalf("smtp sink: %q", s.out.Text())
	}
	return s
}

// cpu returns the sink's CPU time so far and the messages it accepted.
func (s *smtpBenchSink) cpu(b *testing.B) (time.Duration, int) {
	b.Helper()
	if _, err := io.WriteString(s.in, "cpu\n"); err != nil || !s.out.Scan() {
		b.Fatalf("smtp sink: %v", err)
	}
	var ns int64
	var n int
	if _, err := fmt.Sscanf(s.out.Text(), "cpu %d %d", &ns, &n); err != nil {
		b.Fatalf("smtp sink: %q: %v", s.out.Text(), err)
	}
	return time.Duration(ns), n
}

// BenchmarkSMTPSend sends one email per Send, as dispatch does, through
// the smtp sender to the counting fake in a child process over loopback
// TCP (tls none), from conc goroutines sharing one sender whose account
// has concurrency conc. Besides ns/op and allocs/op it reports the CPU
// time per message of this process (client-µs/msg: the sender, its
// connections and the benchmark loop) and of the sink (sink-µs/msg).
// Each case runs against a sink without PIPELINING (serial: go-mail's
// transaction), then one with it (pipelined), then one with CHUNKING as
// well (chunked), one after the other.
//
//	go test -run '^$' -bench BenchmarkSMTPSend -benchtime 20000x ./channels
func BenchmarkSMTPSend(b *testing.B) {
	modes := []string{"serial", "pipelined", "chunked"}
	sinks := map[string]*smtpBenchSink{}
	for _, m := range modes {
		sinks[m] = startSMTPBenchSink(b, m)
	}
	type benchCase struct {
		name  string
		conc  int
		html  bool
		mode  string
		conns int // 0: one connection per message in flight
	}
	var cases []benchCase
	for _, c := range []benchCase{{"plain/conc=1", 1, false, "", 0}, {"plain/conc=4", 4, false, "", 0},
		{"plain/conc=16", 16, false, "", 0}, {"html/conc=4", 4, true, "", 0}} {
		for _, m := range modes {
			mc := c
			mc.name, mc.mode = m+"/"+c.name, m
			cases = append(cases, mc)
		}
	}
	// Shared connections: several transactions to a write (smtp_shared.go).
	for _, c := range []benchCase{{"plain/conc=16/conns=4", 16, false, "chunked", 4},
		{"plain/conc=64/conns=64", 64, false, "chunked", 0}, {"plain/conc=64/conns=16", 64, false, "chunked", 16},
		{"plain/conc=64/conns=8", 64, false, "chunked", 8}} {
		c.name = c.mode + "/" + c.name
		cases = append(cases, c)
	}
	for _, bc := range cases {
		sink := sinks[bc.mode]
		b.Run(bc.name, func(b *testing.B) {
			js := fmt.Sprintf(`{"channel":"smtp","host":"127.0.0.1","port":%d,"tls":"none",
				"from":"Bench <bench@example.org>","subject":"Hello","html":%t,"concurrency":%d,"connections":%d}`,
				sink.port, bc.html, bc.conc, bc.conns)
			acct, err := contract.DecodeAccount("bench", []byte(js))
			if err != nil {
				b.Fatal(err)
			}
			s, err := SMTP{}.NewSender(acct, os.Getenv)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = s.(io.Closer).Close() }()
			body := "Hello User %d, this is the benchmark message."
			if bc.html {
				body = "<p>Hello <b>User %d</b>, this is the benchmark message.</p>"
			}
			send := func(i int) {
				m := Message{ID: "01JBENCH" + strconv.Itoa(i) + ".0", TaskID: "01JBENCH",
					To: "user" + strconv.Itoa(i) + "@example.org", Body: fmt.Sprintf(body, i)}
				if r := s.Send(context.Background(), []Message{m}); !r[0].OK() {
					b.Errorf("send %d: %+v", i, r[0])
				}
			}
			// Open the connections before timing.
			var wg sync.WaitGroup
			for g := range bc.conc {
				wg.Go(func() { send(-1 - g) })
			}
			wg.Wait()

			sinkStart, acceptedStart := sink.cpu(b)
			b.ReportAllocs()
			b.ResetTimer()
			start := cpuTime(syscall.RUSAGE_SELF)
			var next atomic.Int64
			for range bc.conc {
				wg.Go(func() {
					for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
						send(i)
					}
				})
			}
			wg.Wait()
			client := time.Duration(cpuTime(syscall.RUSAGE_SELF) - start)
			b.StopTimer()
			sinkEnd, acceptedEnd := sink.cpu(b)
			if got := acceptedEnd - acceptedStart; got != b.N {
				b.Fatalf("sink accepted %d messages, want %d", got, b.N)
			}
			b.ReportMetric(float64(client.Microseconds())/float64(b.N), "client-µs/msg")
			b.ReportMetric(float64((sinkEnd-sinkStart).Microseconds())/float64(b.N), "sink-µs/msg")
		})
	}
}
