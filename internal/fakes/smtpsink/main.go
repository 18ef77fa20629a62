// Command smtpsink serves the counting SMTP fake of internal/fakes on a
// loopback port for benchmarks against other systems
// (scripts/compare-listmonk.sh). It prints "addr HOST:PORT" first, then,
// once it has accepted -n messages, "done FIRST LAST distinct D" (FIRST and
// LAST the Unix nanoseconds of the first and the n-th accepted message, D
// the number of distinct first recipients among them), and keeps serving
// until it is signalled. Accepted messages are kept in memory: run one per
// measurement.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/broadcastd/broadcast/internal/fakes"
)

func main() {
	n := flag.Int64("n", 20000, "print done after this many accepted messages")
	dump := flag.String("dump", "", "write the first accepted message (its DATA) to this file")
	chunking := flag.Bool("chunking", true, "offer CHUNKING (BDAT), as Postfix does by default; false answers as a server without it")
	flag.Parse()

	var (
		count atomic.Int64
		mu    sync.Mutex
		seen  = map[string]bool{}
		first atomic.Int64
		done  = make(chan time.Time, 1)
	)
	sink, err := fakes.StartSMTP(fakes.SMTPConfig{Data: func(m fakes.Mail) string {
		if len(m.To) > 0 {
			mu.Lock()
			seen[m.To[0]] = true
			mu.Unlock()
		}
		c := count.Add(1)
		if c == 1 {
			first.Store(time.Now().UnixNano())
			if *dump != "" {
				_ = os.WriteFile(*dump, m.Data, 0o644)
			}
		}
		if c == *n {
			done <- time.Now()
		}
		return "" // accept
	}, NoChunking: !*chunking})
	if err != nil {
		fmt.Fprintln(os.Stderr, "smtpsink:", err)
		os.Exit(1)
	}
	fmt.Printf("addr %s\n", sink.Addr())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case at := <-done:
		mu.Lock()
		d := len(seen)
		mu.Unlock()
		fmt.Printf("done %d %d distinct %d\n", first.Load(), at.UnixNano(), d)
		<-sig
	case <-sig:
	}
	fmt.Printf("accepted %d connections %d\n", count.Load(), sink.Connections())
	sink.Close()
}
