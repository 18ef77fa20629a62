// Command broadcast runs Broadcast's services and its operator tools.
//
//	broadcast setup [-replicas N]            create or update the topology (before the services)
//	broadcast ingest|render|dispatch|status|feedback  run one service against NATS_URL
//	broadcast all                            run all five services against NATS_URL
//	broadcast dev                            embedded nats-server + all services + a sandbox account
//	broadcast demo                           a 2,000-recipient broadcast on embedded defaults
//	broadcast send FILE                      publish a task and follow it to its final state
//	broadcast watch [-receipts D] [-lines] ID  follow a task's progress (and its receipts for D after it ends)
//	broadcast tasks                          list tasks
//	broadcast pause|resume|cancel|retry-dead ID  control a task
//	broadcast gateway                        a fault-injecting HTTP gateway (webhook provider)
//	broadcast certs                          route certificates for deploy/cluster
//	broadcast authconf [-nsc]                the servers' users and permissions (auth.conf), or nsc commands
//	broadcast torture -seed N -n M           the randomized scenario tester (internal/scenario)
//	broadcast tape TASK                      what the providers answered for a task, as a replayable tape
//	broadcast suppress add|remove|list|import  manage the suppression list (KV broadcast_suppressions)
//	broadcast policy get|set|rm|ls|check     manage the recipient policy (KV broadcast_policy)
//	broadcast dead ls|show|retry TASK        a task's dead letters: list, inspect, re-queue (all or some)
//	broadcast accounts                       accounts with health, effective rate and daily use
//	broadcast lookup RECIPIENT               which tasks sent to a recipient, when, how it ended
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	// The zone database in the binary: quiet hours are judged in the
	// recipient's zone also on hosts without tzdata (slim images).
	_ "time/tzdata"
)

const usage = `usage: broadcast <command> [flags]

setup (connects to NATS_URL as a user allowed to change streams: admin):
  setup        create or update every stream, KV bucket and object store
               (-replicas N; idempotent); the services only check them

services (connect to NATS_URL; wait for setup's topology, then fail naming what is missing):
  ingest, render, dispatch, status, feedback   run one service
  all                                          run all five in one process

tools:
  dev          embedded nats-server on 127.0.0.1:4222 + all services + a sandbox account
  demo         send a 2,000-recipient broadcast with injected faults on embedded defaults
  send FILE    publish the task in FILE (- for stdin) and follow it to its final state
  watch ID     follow a task's progress (bar, rate, ETA) until it is final
               (-receipts 10m: then show the providers' receipts that long;
               -lines: a line a second with sent, failed, skipped per second, retrying, rate)
  tasks        list tasks with their state and counts (-json for JSON lines)
  pause ID, resume ID, cancel ID, retry-dead ID
               control a task (broadcast.control.<ID>)
  gateway      run a fault-injecting HTTP gateway that speaks the webhook protocol
  certs        write the TLS certificates of deploy/cluster's routes (-dir, -hosts, -days)
  authconf     write the servers' users and permissions (-o auth.conf), or with -nsc the nsc commands
  bench        measure the pipeline against raw JetStream publishing (-n, -replicas 1,2,4)
  torture      run randomized scenarios and check every promise (-seed N -n M, -duration, -multiprocess)
  tape TASK    write what the providers answered for a task (-json: a tape for gateway -tape)
  suppress     manage the suppression list: add (-channel C | -all) -reason R [-categories a,b] TO,
               remove (-channel C | -all) TO, list [-json], import FILE (CSV to,reason,... or JSONL)
  policy       manage the recipient policy (frequency caps, quiet hours): get [-json] [KEY],
               set KEY JSON|- (validated first), rm KEY, ls [-json], check JSON|- (validate only);
               KEY is default or a channel
  dead ls|show|retry TASK
               a task's dead letters: ls [-offset N -limit N], show TASK SEQ (every attempt),
               retry [-seqs 12,15] (all, or only those); each with -json
  accounts     accounts with health, effective rate against the ceiling, daily use (-json)
  lookup RECIPIENT
               which tasks sent to a recipient, when, through which account, how it ended (-json)

environment: NATS_URL, NATS_USER, NATS_PASSWORD, NATS_CREDS, LOG_FORMAT (text|json), LOG_LEVEL
run "broadcast <command> -h" for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "setup":
		err = runSetup(ctx, args, os.Stdout)
	case "ingest", "render", "dispatch", "status", "feedback", "all":
		err = runServiceCommand(ctx, cmd, args)
	case "dev":
		err = runDev(ctx, args)
	case "demo":
		err = runDemo(ctx, args)
	case "send":
		err = runSend(ctx, args)
	case "watch":
		err = runWatch(ctx, args)
	case "gateway":
		err = runGateway(ctx, args)
	case "bench":
		err = runBench(ctx, args)
	case "torture":
		err = runTorture(ctx, args)
	case "tape":
		err = runTape(ctx, args)
	case "tasks":
		err = runTasks(ctx, args)
	case "certs":
		err = runCerts(args)
	case "authconf":
		err = runAuthconf(args)
	case "suppress":
		err = runSuppress(ctx, args)
	case "policy":
		err = runPolicy(ctx, args)
	case "dead", "accounts", "lookup":
		err = runOperatorCommand(ctx, cmd, args)
	case "pause", "resume", "cancel", "retry-dead":
		err = runControl(ctx, cmd, args)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "broadcast: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "broadcast:", err)
		var ec exitCode
		if errors.As(err, &ec) {
			os.Exit(int(ec))
		}
		os.Exit(1)
	}
}

// exitCode lets a command choose its exit status.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }
