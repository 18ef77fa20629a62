#!/usr/bin/env bash
# Chaos test: run the Procfile stack as real OS processes (nats-server from
# nats.conf with its least-privilege users, ingest, render, dispatch and
# status each with its own user's credentials from the Procfile, and a
# fault-injecting gateway), send a 5,000-recipient webhook broadcast, and
# while it runs kill -9 each process in turn (nats-server included) and
# restart it. At the end the gateway's ledger is the judge:
#
#   lost                recipients never accepted by the gateway       must be 0
#   duplicated          recipients accepted more than once             must be <= kills x concurrency
#                       (only a send in flight at a kill may repeat)
#   progress mismatch   |sent - accepted| + |failed - bad| + |total - N| must be 0
#
# plus: the task reaches a final state, every process was killed and is
# running again, and nats-server logged no permission violation. The last
# line is "chaos: N passed, M failed"; the exit status is 0 only when M is 0.
#
# Needs: go, jq, curl, setsid, the nats CLI (natscli v0.5.0, on PATH or in
# $(go env GOPATH)/bin). It builds its own binaries into .chaos/bin, uses free
# ports from 14222 (NATS), 18222 (monitoring) and 19500 (gateway), and keeps
# everything under .chaos/ (logs kept after a failure or with CHAOS_KEEP=1).
#
# Knobs: CHAOS_N (recipients, default 5000), CHAOS_SEED (kill timing and gateway
# faults, default: time-based), CHAOS_TIMEOUT (seconds for the task, default 300).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SCRIPT=chaos
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

N="${CHAOS_N:-5000}"
SEED="${CHAOS_SEED:-$(($(date +%s) % 100000))}"
TASK_TIMEOUT="${CHAOS_TIMEOUT:-300}"
CONCURRENCY=8
BAD_EVERY=100 # every 100th recipient is rejected permanently (400)
DIR="$ROOT/.chaos"
LOG_DIR="$DIR/logs"
START_TS=$(date +%s)
RANDOM=$SEED
WAIT_INTERVAL=0.3

need go "install Go 1.26"
need jq "apt-get install -y jq"
need curl "apt-get install -y curl"
need setsid "util-linux"
find_nats_cli
load_dotenv # the operator, for the nats CLI

# ---------------------------------------------------------------- cleanup
cleanup() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	stop_all
	if ((rc != 0 || FAILED > 0 || FATAL)); then
		print_log_tails 30 "$LOG_DIR"/*.log
		log "logs kept in ${DIR#"$ROOT"/}/"
	elif [[ "${CHAOS_KEEP:-0}" != 1 ]]; then
		rm -rf "$DIR"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------- build and configure
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$LOG_DIR"
log "building broadcast and nats-server into ${DIR#"$ROOT"/}/bin"
go build -o "$DIR/bin/broadcast" ./cmd/broadcast || die "go build ./cmd/broadcast failed"
go build -o "$DIR/bin/nats-server" github.com/nats-io/nats-server/v2 || die "building nats-server failed"

NATS_PORT=$(free_port 14222)
MON_PORT=$(free_port 18222)
GW_PORT=$(free_port 19500)
NATS_URL="nats://127.0.0.1:$NATS_PORT" # this run's server, not the one .env names
GW_URL="http://127.0.0.1:$GW_PORT"

# nats.conf as it is (users and permissions), with this run's ports and store.
sed -e "s|^port: 4222$|port: $NATS_PORT|" \
	-e "s|^http: 127.0.0.1:8222$|http: 127.0.0.1:$MON_PORT|" \
	-e "s|store_dir: \".data/nats\"|store_dir: \"$DIR/store\"|" nats.conf >"$DIR/nats.conf"
grep -q "port: $NATS_PORT" "$DIR/nats.conf" && grep -q "$DIR/store" "$DIR/nats.conf" ||
	die "could not rewrite nats.conf's port and store_dir (changed format?)"
cp auth.conf "$DIR/auth.conf" # nats.conf includes it, relative to itself

# Each service's credentials from its Procfile line (the operator's came
# from .env).
creds() { # creds NAME -> "USER PASSWORD"
	local line
	line=$(grep -E "^$1:" Procfile) || die "no Procfile line for $1"
	[[ "$line" =~ NATS_USER=([^[:space:]]+)[[:space:]]+NATS_PASSWORD=([^[:space:]]+) ]] || die "Procfile line $1 sets no NATS_USER/NATS_PASSWORD"
	echo "${BASH_REMATCH[1]} ${BASH_REMATCH[2]}"
}
nats_init "$DIR/natscli" 5s

# ---------------------------------------------------------------- start
log "seed $SEED; nats $NATS_URL, gateway $GW_URL"
start nats "$DIR/bin/nats-server" -c "$DIR/nats.conf"
read -r u p < <(creds setup)
env NATS_URL="$NATS_URL" NATS_USER="$u" NATS_PASSWORD="$p" NATS_CREDS= "$DIR/bin/broadcast" setup >"$DIR/logs/setup.log" 2>&1 ||
	die "broadcast setup failed: $(tail -3 "$DIR/logs/setup.log")"
start gateway "$DIR/bin/broadcast" gateway -addr "127.0.0.1:$GW_PORT" -fail-rate 0.05 -rate-limited-rate 0.02 \
	-retry-after 1s -latency 5ms -permanent-prefix bad- -seed "$SEED"
SERVICES=(ingest render dispatch status)
for s in "${SERVICES[@]}"; do
	read -r u p < <(creds "$s")
	start "$s" env NATS_URL="$NATS_URL" NATS_USER="$u" NATS_PASSWORD="$p" NATS_CREDS= LOG_FORMAT=json DASHBOARD_ADDR=off \
		DISPATCH_BACKOFF_BASE=100ms DISPATCH_BACKOFF_MAX=2s "$DIR/bin/broadcast" "$s"
done

wait_for 60 "nats-server" nats_ stream ls --names
wait_for 60 "the gateway" curl -fsS "$GW_URL/ledger"
wait_for 90 "the services" services_ready

ACCOUNT=$(jq -cn --arg ep "$GW_URL/send" --argjson c "$CONCURRENCY" \
	'{channel:"webhook",endpoint:$ep,rate_per_sec:200,burst:10,concurrency:$c,min_rate_per_sec:100,recover_after:5}')
nats_ kv put broadcast_accounts hook "$ACCOUNT" >/dev/null
wait_for 30 "account hook (consumer dispatch-hook)" has_consumer JOBS dispatch-hook

# ---------------------------------------------------------------- broadcast
TASK_ID="chaos-$SEED-$(date +%s)"
jq -cn --arg id "$TASK_ID" --argjson n "$N" --argjson bad "$BAD_EVERY" '{
	id: $id, channel: "webhook", template: "Hello {{.to}}", max_attempts: 30,
	recipients: [range(0; $n) | if . % $bad == ($bad / 2) then {to: "bad-\(.)"} else {to: "user-\(.)"} end]
}' >"$DIR/task.json"
BAD=$(jq '[.recipients[].to | select(startswith("bad-"))] | length' "$DIR/task.json")
log "publishing $TASK_ID: $N recipients ($BAD rejected permanently by the gateway), account concurrency $CONCURRENCY"
publish_task "$DIR/task.json" >"$DIR/pub.out" 2>&1 || die "publish failed: $(cat "$DIR/pub.out")"
T0_NS=$(date +%s%N)
T0=$((T0_NS / 1000000000))

progress() { get_progress "$TASK_ID" || echo "$EMPTY"; }
requests() { curl -fsS "$GW_URL/ledger" 2>/dev/null | jq -r '.requests // 0' || echo 0; }
sends_above() { (($(requests) > $1)); }

# Kill each process in turn once the broadcast is sending: ingest and render
# while their work may still be in flight, then dispatch, status and the
# server, then dispatch once more; each after a random 1.5-3.5 s of
# progress since the previous restart.
ORDER=(ingest render dispatch status nats dispatch)
KILLS=0
KILLED=()
wait_for 60 "the first sends" sends_above 0
for victim in "${ORDER[@]}"; do
	p=$(progress)
	state=$(jq -r '.state // ""' <<<"$p")
	if is_final "$state"; then
		log "task already $state before killing $victim"
		break
	fi
	sleep "$((1 + RANDOM % 2)).$((5 + RANDOM % 5))"
	before=$(requests)
	kill9 "$victim"
	KILLS=$((KILLS + 1))
	KILLED+=("$victim")
	log "kill -9 #$KILLS $victim at +$(($(date +%s) - T0))s: gateway requests=$before, progress sent=$(jq -r '.sent // 0' <<<"$p")"
	sleep 0.5
	restart "$victim"
	if [[ "$victim" == nats ]]; then
		wait_for 60 "nats-server after its restart" nats_ stream ls --names
	fi
	# Sending must resume (for every victim: the pipeline keeps going).
	wait_for 60 "sends to resume after killing $victim" sends_above "$before"
done

# ---------------------------------------------------------------- finish
wait_final "$TASK_ID" "$TASK_TIMEOUT" 5 "$T0_NS"
ELAPSED=$(($(date +%s) - T0))
curl -fsS "$GW_URL/ledger" >"$DIR/ledger.json" || echo '{}' >"$DIR/ledger.json"
echo "$PROGRESS" >"$DIR/progress.json"

errs=()
is_final "$STATE" || errs+=("state: '${STATE:-none}' after ${TASK_TIMEOUT}s, not final")
report "task final ($STATE) in ${ELAPSED}s after $KILLS kills" "${errs[@]}"

# Lost: good recipients whose key the gateway never accepted.
LOST=$(jq -r --arg id "$TASK_ID" --argjson n "$N" --argjson bad "$BAD_EVERY" --slurpfile l "$DIR/ledger.json" -n '
	[range(0; $n) | select(. % $bad != ($bad / 2)) | "\($id).\(.)" | select(($l[0].accepted_by_key[.] // 0) == 0)] | length')
errs=()
((LOST == 0)) || errs+=("$LOST recipients never accepted, e.g. $(jq -r --arg id "$TASK_ID" --argjson n "$N" --argjson bad "$BAD_EVERY" --slurpfile l "$DIR/ledger.json" -n '[range(0; $n) | select(. % $bad != ($bad / 2)) | "\($id).\(.)" | select(($l[0].accepted_by_key[.] // 0) == 0)][:5] | join(" ")')")
report "lost=$LOST" "${errs[@]}"

DUPS=$(jq -r '.duplicates // -1' "$DIR/ledger.json")
ALLOWED=$((KILLS * CONCURRENCY))
errs=()
((DUPS >= 0 && DUPS <= ALLOWED)) || errs+=("duplicated=$DUPS, allowed at most $KILLS kills x $CONCURRENCY in flight = $ALLOWED")
report "duplicated=$DUPS (allowed <= $ALLOWED: sends in flight at $KILLS kills)" "${errs[@]}"

ACCEPTED=$(jq -r '[.accepted_by_key // {} | .[] | select(. > 0)] | length' "$DIR/ledger.json")
SENT=$(jq -r '.sent // 0' <<<"$PROGRESS")
FAILEDN=$(jq -r '.failed // 0' <<<"$PROGRESS")
TOTAL=$(jq -r '.total // 0' <<<"$PROGRESS")
RETRYING=$(jq -r '.retrying // 0' <<<"$PROGRESS")
abs() { echo $(($1 < 0 ? -$1 : $1)); }
MISMATCH=$(($(abs $((SENT - ACCEPTED))) + $(abs $((FAILEDN - BAD))) + $(abs $((TOTAL - N))) + RETRYING))
errs=()
((MISMATCH == 0)) || errs+=("progress sent=$SENT failed=$FAILEDN total=$TOTAL retrying=$RETRYING vs gateway accepted=$ACCEPTED, bad=$BAD, N=$N")
report "progress mismatch=$MISMATCH (sent $SENT = accepted $ACCEPTED, failed $FAILEDN = bad $BAD, total $TOTAL = $N)" "${errs[@]}"

errs=()
for name in nats ingest render dispatch status; do
	[[ " ${KILLED[*]} " == *" $name "* ]] || errs+=("$name was never killed (the task finished first)")
	running "$name" || errs+=("$name is not running after its restart")
done
report "every process killed with -9 and running again (${KILLED[*]})" "${errs[@]}"

VIOLATIONS=$(grep -c "Violation" "$LOG_DIR/nats.log" || true)
errs=()
((VIOLATIONS == 0)) || errs+=("$(grep -m3 "Violation" "$LOG_DIR/nats.log")")
report "no permission violations under the nats.conf users ($VIOLATIONS)" "${errs[@]}"

INJ=$(jq -c '.injected // {}' "$DIR/ledger.json")
REQS=$(jq -r '.requests // 0' "$DIR/ledger.json")
cat <<EOF

chaos: task $TASK_ID: $N recipients, state=$STATE sent=$SENT failed=$FAILEDN total=$TOTAL, ${ELAPSED}s after publish
chaos: kills=$KILLS (${KILLED[*]}); gateway requests=$REQS accepted_keys=$ACCEPTED injected=$INJ
chaos: lost=$LOST duplicated=$DUPS (allowed $ALLOWED) progress_mismatch=$MISMATCH violations=$VIOLATIONS; whole run $(($(date +%s) - START_TS))s
chaos: $PASSED passed, $FAILED failed
EOF
((FAILED == 0))
