#!/usr/bin/env bash
# Smoke test: run the Procfile stack (nats-server, setup and the four services)
# as separate OS processes under foreman, point a webhook account at
# the fault-injecting gateway, and drive everything with the real `nats` CLI
# only (plus curl/jq for the gateway ledger). Exits 0 when every check passes.
#
# Needs: go, foreman (Debian ruby-foreman), nats CLI (natscli v0.5.0, on PATH
# or in $(go env GOPATH)/bin), jq, curl.
#
# Environment knobs (all optional):
#   SMOKE_GATEWAY_PORT   gateway port (default: first free port from 19400)
#   SMOKE_TIMEOUT        seconds to wait for the task to finish (default 120)
#   SMOKE_KEEP_LOGS=1    keep .smoke/ after a passing run (it is always kept
#                        after a failure; it is gitignored either way)
#
# It uses 127.0.0.1:4222 and :8222 (from nats.conf) and refuses to run when
# they are taken. It deletes .data/nats before and after the run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SCRIPT=smoke
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

NATS_SERVER_URL="nats://127.0.0.1:4222"
SMOKE_DIR="$ROOT/.smoke"
STORE_DIR="$ROOT/.data/nats"
TASK_TIMEOUT="${SMOKE_TIMEOUT:-120}"
START_TS=$(date +%s)

# nats.conf admits no anonymous client: the CLI connects as the `operator`
# user from .env (which foreman also loads; each Procfile line then sets its
# own service's user).
load_dotenv
export NATS_URL="$NATS_SERVER_URL"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

# ---------------------------------------------------------------- tools
need go "install Go 1.26"
need foreman "apt-get install -y ruby-foreman"
need jq "apt-get install -y jq"
need curl "apt-get install -y curl"
need setsid "util-linux"
need timeout "coreutils"

find_nats_cli

# ---------------------------------------------------------------- state / cleanup
FOREMAN_PID=""
GATEWAY_PID=""
WATCH_PID=""
CREATED_STORE=0

# split_foreman_log: foreman prefixes each line with "[HH:MM:SS ]name.N | ";
# write one .smoke/<name>.log per process.
split_foreman_log() {
	[[ -f "$SMOKE_DIR/foreman.log" ]] || return 0
	awk -v dir="$SMOKE_DIR" '
		{
			line = $0
			sub(/^[0-9][0-9]:[0-9][0-9]:[0-9][0-9] /, "", line)
			bar = index(line, " | ")
			if (bar == 0) { name = "system" } else {
				name = substr(line, 1, bar - 1)
				gsub(/ +$/, "", name)
				sub(/\.[0-9]+$/, "", name)
				line = substr(line, bar + 3)
			}
			if (name !~ /^[A-Za-z0-9_-]+$/) name = "system"
			print line > (dir "/" name ".log")
		}' "$SMOKE_DIR/foreman.log"
}

# print_logs: each process's log (foreman's own is split into them).
print_logs() {
	local f logs=()
	for f in "$SMOKE_DIR"/*.log; do
		[[ "$(basename "$f")" != foreman.log ]] && logs+=("$f")
	done
	print_log_tails 50 "${logs[@]}"
	printf '\n'
}

cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	[[ -n "$WATCH_PID" ]] && kill "$WATCH_PID" 2>/dev/null
	stop_group "$FOREMAN_PID" foreman
	stop_group "$GATEWAY_PID" gateway
	split_foreman_log
	if ((rc != 0 || FAILED > 0 || FATAL)); then
		print_logs
		log "logs kept in ${SMOKE_DIR#"$ROOT"/}/"
	elif [[ "${SMOKE_KEEP_LOGS:-0}" != 1 ]]; then
		rm -rf "$SMOKE_DIR"
	fi
	if ((CREATED_STORE)); then
		rm -rf "$STORE_DIR"
		rmdir "$ROOT/.data" 2>/dev/null # only when empty
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- preflight
rm -rf "$SMOKE_DIR" # logs of an earlier run must not be mistaken for this one's
mkdir -p "$SMOKE_DIR"
nats_init "$SMOKE_DIR/natscli" 10s

for p in 4222 8222; do
	if port_in_use "$p"; then
		die "127.0.0.1:$p is already in use (another nats-server or 'broadcast dev'?); stop it first"
	fi
done

if [[ -n "${SMOKE_GATEWAY_PORT:-}" ]]; then
	GW_PORT=$SMOKE_GATEWAY_PORT
	port_in_use "$GW_PORT" && die "gateway port $GW_PORT is in use"
else
	GW_PORT=19400
	while port_in_use "$GW_PORT"; do
		GW_PORT=$((GW_PORT + 1))
		((GW_PORT < 19500)) || die "no free gateway port in 19400-19499"
	done
fi
GW_URL="http://127.0.0.1:$GW_PORT"

log "building (go build ./... and the nats-server tool)"
go build ./... || die "go build ./... failed"
go build -o /dev/null tool || die "building the nats-server tool failed"

# ---------------------------------------------------------------- start
rm -rf "$STORE_DIR"
CREATED_STORE=1

log "starting gateway on $GW_URL"
setsid go run ./cmd/broadcast gateway -addr "127.0.0.1:$GW_PORT" \
	-fail-rate 0.1 -rate-limited-rate 0.05 -retry-after 1s \
	-permanent-prefix bad- -seed 3 \
	>"$SMOKE_DIR/gateway.log" 2>&1 </dev/null &
GATEWAY_PID=$!

log "starting the Procfile stack with foreman"
setsid foreman start --no-color -f Procfile -d "$ROOT" \
	>"$SMOKE_DIR/foreman.log" 2>&1 </dev/null &
FOREMAN_PID=$!

# still_running WHEN: die when foreman or the gateway has exited (wait_for
# and wait_final call it).
still_running() {
	kill -0 "$FOREMAN_PID" 2>/dev/null || die "foreman exited $1"
	kill -0 "$GATEWAY_PID" 2>/dev/null || die "gateway exited $1"
}

wait_for 120 "NATS JetStream" nats_ kv ls --names
log "NATS is up"
wait_for 60 "the gateway" curl -fsS "$GW_URL/ledger"
wait_for 120 "the services (consumers ingest, render, status)" services_ready
log "services are up"

# ---------------------------------------------------------------- 1. account
ACCOUNT_JSON=$(jq -cn --arg ep "$GW_URL/send" \
	'{channel:"webhook",endpoint:$ep,rate_per_sec:100,burst:10,concurrency:8,min_rate_per_sec:50,recover_after:5}')
nats_ kv put broadcast_accounts hook-a "$ACCOUNT_JSON" >/dev/null
log "account hook-a -> $GW_URL/send"
wait_for 60 "dispatch to start account hook-a (consumer dispatch-hook-a)" has_consumer JOBS dispatch-hook-a

# ---------------------------------------------------------------- 2. task
TASK_ID="smoke-$(date +%s)"
TASK_FILE="$SMOKE_DIR/task.json"
DISTINCT=400
NO_VARS=7 # recipient user-7 has no vars: its template lacks .name -> skipped
jq -cn --arg id "$TASK_ID" --argjson n "$DISTINCT" --argjson novars "$NO_VARS" '
	def rcpt($i):
		if $i == $novars then {to: "user-\($i)"}
		elif $i % 40 == 0 then {to: "bad-\($i)", vars: {name: "\($i)"}}
		else {to: "user-\($i)", vars: {name: "\($i)"}} end;
	{
		id: $id,
		channel: "webhook",
		template: "Hi {{.name}}",
		max_attempts: 8,
		recipients: ([range(1; $n + 1) | rcpt(.)] + [rcpt(1), rcpt(2)])
	}' >"$TASK_FILE"

BAD=$(jq '[.recipients[].to | select(startswith("bad-"))] | unique | length' "$TASK_FILE")
SKIP=$(jq '[.recipients[] | select(.vars == null) | .to] | unique | length' "$TASK_FILE")
REPEATS=$(jq '(.recipients | length) - ([.recipients[].to] | unique | length)' "$TASK_FILE")
WANT_SENT=$((DISTINCT - BAD - SKIP))

# Capture the progress key's updates while the task runs.
timeout 15 "${NATS_CLI[@]}" kv watch broadcast_progress "$TASK_ID" >"$SMOKE_DIR/watch.out" 2>&1 &
WATCH_PID=$!
sleep 1

log "publishing task $TASK_ID: $((DISTINCT + REPEATS)) recipients ($DISTINCT distinct, $BAD bad-, $SKIP without vars, $REPEATS repeated)"
T0=$(date +%s%N)
publish_task "$TASK_FILE" >"$SMOKE_DIR/pub1.out" 2>&1 || die "nats pub failed: $(cat "$SMOKE_DIR/pub1.out")"

# ---------------------------------------------------------------- 3. follow
wait_final "$TASK_ID" "$TASK_TIMEOUT" 2 "$T0"
ELAPSED=$(since "$T0")
echo "$PROGRESS" >"$SMOKE_DIR/progress.json"

errs=()
expect errs "state" partial "${STATE:-none}"
report "task reached final state 'partial' within ${TASK_TIMEOUT}s (took ${ELAPSED}s)" "${errs[@]}"

# ---------------------------------------------------------------- 4. figures
pf() { jq -r "$1" <<<"${PROGRESS:-$EMPTY}"; }
P_TOTAL=$(pf '.total // "missing"')
P_DUP=$(pf '.duplicates // "missing"')
P_SENT=$(pf '.sent // "missing"')
P_FAILED=$(pf '.failed // "missing"')
P_SKIPPED=$(pf '.skipped // "missing"')
P_RETRYING=$(pf '.retrying // "missing"')
P_EXPIRED=$(pf '.expired // "missing"')
P_CANCELLED=$(pf '.cancelled // "missing"')
errs=()
expect errs total "$DISTINCT" "$P_TOTAL"
expect errs duplicates "$REPEATS" "$P_DUP"
expect errs sent "$WANT_SENT" "$P_SENT"
expect errs failed "$BAD" "$P_FAILED"
expect errs skipped "$SKIP" "$P_SKIPPED"
expect errs retrying 0 "$P_RETRYING"
expect errs expired 0 "$P_EXPIRED"
expect errs cancelled 0 "$P_CANCELLED"
expect errs "sent+failed+skipped+expired+cancelled == total" true \
	"$(pf '(.sent + .failed + .skipped + .expired + .cancelled) == .total' 2>/dev/null || echo error)"
expect errs "finished_at set" true "$(pf '.finished_at != null')"
# failed recipients are in DEAD, one message each (only this task has failures)
DEAD_MSGS=$(nats_ stream info DEAD --json 2>/dev/null | jq -r '.state.messages' || echo error)
expect errs "messages in stream DEAD" "$BAD" "$DEAD_MSGS"
report "progress figures exact (total $DISTINCT, duplicates $REPEATS, sent $WANT_SENT, failed $BAD, skipped $SKIP, retrying 0; $BAD in DEAD)" "${errs[@]}"

# kv watch: the key changed at least twice while the task ran
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
WATCH_UPDATES=$(grep -c -- "> $TASK_ID: " "$SMOKE_DIR/watch.out" || true)
errs=()
if ((WATCH_UPDATES < 2)); then
	errs+=("nats kv watch updates: expected >= 2, got $WATCH_UPDATES ($(head -c 300 "$SMOKE_DIR/watch.out"))")
fi
report "nats kv watch saw $WATCH_UPDATES progress updates (>= 2)" "${errs[@]}"

# gateway ledger
LEDGER=$(curl -fsS "$GW_URL/ledger" || echo '{}')
echo "$LEDGER" >"$SMOKE_DIR/ledger.json"
lf() { jq -r "$1" <<<"$LEDGER"; }
L_REQUESTS=$(lf '.requests // "missing"')
L_KEYS=$(lf '(.accepted_by_key // {}) | length')
L_DUPS=$(lf '.duplicates // "missing"')
L_400=$(lf '.injected["400"] // "missing"')
L_503=$(lf '.injected["503"] // "missing"')
L_429=$(lf '.injected["429"] // "missing"')
L_504=$(lf '.injected["504"] // "missing"')
L_REFUSED=$(lf '.refused // "missing"')
L_MAXPS=$(lf '.max_per_second["hook-a"] // 0')
L_BADBODY=$(lf '[(.bodies // {})[] | select(test("^Hi [0-9]+$") | not)] | length')
errs=()
expect errs "distinct accepted keys (accepted_by_key)" "$P_SENT" "$L_KEYS"
expect errs "distinct accepted keys vs expected sent" "$WANT_SENT" "$L_KEYS"
expect errs "gateway duplicates" 0 "$L_DUPS"
expect errs "injected[400] (one try per permanent reject)" "$BAD" "$L_400"
expect errs "bodies not rendered as 'Hi <n>'" 0 "$L_BADBODY"
if ! [[ "$L_MAXPS" =~ ^[0-9]+$ ]] || ((L_MAXPS > 100 + 10)); then
	errs+=("max accepted per second for hook-a: expected <= 110 (rate 100 + burst 10), got $L_MAXPS")
fi
report "gateway ledger: $L_KEYS distinct keys accepted, 0 duplicates, $L_400 x 400, peak $L_MAXPS/s" "${errs[@]}"

# Not a check (the figures above hold either way), but worth a look: the
# gateway runs with -timeout-rate 0 and -rate-limited-rate 0.05, so it should
# answer some 429s and no 504s.
if [[ "$L_504" != 0 || "$L_429" == 0 ]]; then
	log "WARNING: gateway injected 504=$L_504 429=$L_429 with -timeout-rate 0 -rate-limited-rate 0.05 (expected 504=0, 429>0): see drawFault in internal/gateway"
fi

# ---------------------------------------------------------------- 5. resubmit
REQ_BEFORE=$L_REQUESTS
PROG_KEYS='{state,total,duplicates,sent,retrying,failed,skipped,expired,cancelled,finished_at}'
PROG_BEFORE=$(jq -cS "$PROG_KEYS" <<<"${PROGRESS:-$EMPTY}" 2>/dev/null || echo none)
log "publishing task $TASK_ID again (must be ignored)"
errs=()
if publish_task "$TASK_FILE" >"$SMOKE_DIR/pub2.out" 2>&1; then
	sleep 5
	REQ_AFTER=$(curl -fsS "$GW_URL/ledger" | jq -r '.requests // "missing"' || echo error)
	PROG_AFTER=$(get_progress "$TASK_ID" | jq -cS "$PROG_KEYS" 2>/dev/null || echo none)
	expect errs "gateway requests after resubmit" "$REQ_BEFORE" "$REQ_AFTER"
	expect errs "progress after resubmit" "$PROG_BEFORE" "$PROG_AFTER"
else
	errs+=("second nats pub failed: $(cat "$SMOKE_DIR/pub2.out")")
fi
report "duplicate task id ignored (gateway requests and progress unchanged after 5s)" "${errs[@]}"

# ---------------------------------------------------------------- 6. malformed
BAD_FILE="$SMOKE_DIR/task-bad.json"
echo '{"id":"smoke-bad","template":"x","recipients":[{"to":"a"}]}' >"$BAD_FILE"
log "publishing malformed task smoke-bad (no channel)"
errs=()
if publish_task "$BAD_FILE" >"$SMOKE_DIR/pub3.out" 2>&1; then
	BAD_STATE=""
	BAD_PROGRESS=""
	bad_deadline=$(($(date +%s) + 30))
	while (($(date +%s) < bad_deadline)); do
		if p=$(get_progress smoke-bad) && [[ -n "$p" ]]; then
			BAD_PROGRESS=$p
			BAD_STATE=$(jq -r .state <<<"$p")
			is_final "$BAD_STATE" && break
		fi
		sleep 0.5
	done
	expect errs "smoke-bad state" rejected "${BAD_STATE:-none}"
	BAD_ERROR=$(jq -r '.error // ""' <<<"${BAD_PROGRESS:-$EMPTY}")
	if [[ "$BAD_ERROR" != *"channel: required"* ]]; then
		errs+=("smoke-bad error: expected to contain 'channel: required', got '$BAD_ERROR'")
	fi
else
	errs+=("nats pub of the malformed task failed: $(cat "$SMOKE_DIR/pub3.out")")
fi
report "malformed task rejected with 'channel: required'" "${errs[@]}"

# ---------------------------------------------------------------- summary
TOTAL_ELAPSED=$(($(date +%s) - START_TS))
cat <<EOF

smoke: task $TASK_ID: state=${STATE:-none} total=$P_TOTAL duplicates=$P_DUP sent=$P_SENT failed=$P_FAILED skipped=$P_SKIPPED retrying=$P_RETRYING
smoke: finished in ${ELAPSED}s after publish; whole smoke run ${TOTAL_ELAPSED}s
smoke: gateway: requests=$L_REQUESTS distinct_accepted=$L_KEYS duplicates=$L_DUPS refused=$L_REFUSED injected 503=$L_503 429=$L_429 504=$L_504 400=$L_400; peak ${L_MAXPS}/s
smoke: dead letters=$DEAD_MSGS; kv watch updates=$WATCH_UPDATES; smoke-bad: ${BAD_STATE:-none} (${BAD_ERROR:-})
smoke: $PASSED passed, $FAILED failed
EOF
((FAILED == 0))
