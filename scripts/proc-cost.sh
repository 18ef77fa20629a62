#!/usr/bin/env bash
# Optional, manual: CPU per recipient of each process of the process
# topology (nats-server from nats.conf's settings and users, ingest,
# render, dispatch and status as separate processes, as in the Procfile)
# with a zero-latency sandbox account, so no provider client is measured.
# Not part of CI or `go test`.
#   bash scripts/proc-cost.sh
# For each round, each rate in RATES and each N in NS: a fresh server and
# services; once dispatch holds the account and its first session has
# idled out (the account asleep: no lease, its asleep mark in KV
# broadcast_lanes, its consumer kept or deleted), the idle
# CPU of each process over IDLE seconds; then one task of N recipients (a
# JSONL list in the object store) at the account's rate, and each
# process's CPU (utime+stime from /proc/<pid>/stat) from the submit to the
# task's final state, per recipient, and its read and write system calls
# over the same span (syscr+syscw of /proc/<pid>/io: reads, writes,
# pwrites), per recipient.
# Knobs: NS ("20000 200000"), RATES ("2500 0"; 0 is unpaced), ROUNDS (1),
# ACCOUNTS (1: sandbox accounts sharing the rate, the task's pool, as
# `bench -accounts`; above 1, dispatch's session ends and lease refreshes
# are read from its metrics after the task),
# IDLE (20), DASHBOARD (1: status serves its dashboard on a
# free loopback port, as by default; 0: DASHBOARD_ADDR=off), PROFILE (0;
# 1: PROFILE_SECS-second CPU profiles of every process while idle and from
# the submit, in $WORK/prof), SVC_ENV (extra NAME=VALUE settings for the
# services, e.g. "GOGC=200"), BINS (prebuilt broadcast binaries to
# compare: each configuration runs once with each, alternating; default:
# one built from this tree), BENCH_LOCK (/tmp/bench.lock, taken
# around each measured span; "" for none), OUT. Needs the nats CLI
# (natscli v0.5.0), jq, curl (PROFILE=1), flock and a populated module
# cache (GOPROXY=off). Everything listens on 127.0.0.1.
# docs/performance.md ("Per process") has the figures.
set -euo pipefail

NS="${NS:-20000 200000}"
RATES="${RATES-2500 0}"
ROUNDS="${ROUNDS:-1}"
ACCOUNTS="${ACCOUNTS:-1}"
IDLE="${IDLE:-20}"
DASHBOARD="${DASHBOARD:-1}"
PROFILE="${PROFILE:-0}"
PROFILE_SECS="${PROFILE_SECS:-15}"
SVC_ENV="${SVC_ENV:-}"
BINS="${BINS:-}"
BENCH_LOCK="${BENCH_LOCK-/tmp/bench.lock}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SCRIPT=proc-cost
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

need jq "apt-get install -y jq"
need flock "util-linux"
((PROFILE == 0 && ACCOUNTS == 1)) || need curl "apt-get install -y curl"
find_nats_cli

WORK="$(mktemp -d /tmp/proc-cost.XXXXXX)"
OUT="${OUT:-$WORK/results.tsv}"
LOG_DIR="$WORK"
SVCS=(nats-server ingest render dispatch status)
declare -A P
cleanup() {
	local p
	for p in "${P[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK/store"
	log "logs and results in $WORK"
}
trap cleanup EXIT

log "building broadcast and nats-server (GOPROXY=off)"
export GOPROXY=off GOFLAGS="${GOFLAGS:--buildvcs=false}"
if [[ -z "$BINS" ]]; then
	go build -o "$WORK/broadcast" ./cmd/broadcast
	BINS="$WORK/broadcast"
fi
go build -o "$WORK/nats-server" github.com/nats-io/nats-server/v2

TCK=$(getconf CLK_TCK)
# ticks PID: utime+stime of PID (0 when it is gone).
ticks() {
	local s
	s=$(cat "/proc/$1/stat" 2>/dev/null) || {
		echo 0
		return
	}
	s=${s##*) }
	# shellcheck disable=SC2086
	set -- $s
	echo $((${12} + ${13}))
}
# snapshot: "TICKS TICKS ..." of SVCS, in order.
snapshot() {
	local s out=""
	for s in "${SVCS[@]}"; do out+="$(ticks "${P[$s]}") "; done
	echo "$out"
}
# iocalls PID: read and write system calls of PID so far (syscr+syscw of
# /proc/<pid>/io; 0 when it is gone): reads, writes and pwrites, not
# epoll or futex.
iocalls() {
	awk '/^sysc[rw]:/ { n += $2 } END { print n + 0 }' "/proc/$1/io" 2>/dev/null || echo 0
}
# iosnapshot: "CALLS CALLS ..." of SVCS, in order.
iosnapshot() {
	local s out=""
	for s in "${SVCS[@]}"; do out+="$(iocalls "${P[$s]}") "; done
	echo "$out"
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
lock() { if [[ -n "$BENCH_LOCK" ]]; then exec 9>"$BENCH_LOCK" && flock 9; fi; }
unlock() { if [[ -n "$BENCH_LOCK" ]]; then exec 9>&-; fi; }
still_running() {
	local s
	for s in "${SVCS[@]}"; do
		[[ -z "${P[$s]:-}" ]] || running_pid "${P[$s]}" || die "$s exited $1 (see $WORK/$s.log)"
	done
}
running_pid() { kill -0 "$1" 2>/dev/null; }

# profile_all TAG: PROFILE_SECS-second CPU profiles of every process, in
# the background (PROF_JOBS).
PROF_JOBS=()
profile_all() {
	local s
	((PROFILE)) || return 0
	mkdir -p "$WORK/prof"
	for s in "${SVCS[@]}"; do
		curl -fsS -o "$WORK/prof/$1-$s.pprof" "http://127.0.0.1:${PPORT[$s]}/debug/pprof/profile?seconds=$PROFILE_SECS" 2>>"$WORK/prof/curl.log" &
		PROF_JOBS+=($!)
	done
}
profile_wait() {
	local j
	for j in "${PROF_JOBS[@]}"; do wait "$j" || true; done
	PROF_JOBS=()
}

# put_accounts: each "NAME JSON" line of stdin into KV broadcast_accounts.
put_accounts() {
	local name value
	while read -r name value; do nats_ kv put broadcast_accounts "$name" "$value" >/dev/null; done
}
# no_account_leases: no account's lease is held (every account asleep);
# the bucket's other keys are the services' replicas and status's fold.
no_account_leases() { ! nats_ kv ls broadcast_leases 2>/dev/null | grep -q '^sbx'; }
# all_accounts_asleep N: N accounts have their asleep mark in KV
# broadcast_lanes, left as each session idled out (their consumers kept
# within DISPATCH_KEPT_CONSUMERS, deleted beyond it).
all_accounts_asleep() {
	local names
	names=$(nats_ kv ls broadcast_lanes 2>/dev/null) || return 1
	(($(grep -c '^sbx' <<<"$names") == $1))
}
# lease_counts PORT: dispatch's session ends by cause and lease refreshes
# (all, over 0.5 s, over 1 s) so far, from its metrics on PORT, a
# "name value" line each.
lease_counts() {
	curl -fsS "http://127.0.0.1:$1/metrics" | awk '
		/^broadcast_account_sessions_ended_total/ { split($1, c, "\""); print "ended_" c[2], $2 }
		/^broadcast_lease_refresh_seconds_bucket\{le="0.5"\}/ { le05 = $2 }
		/^broadcast_lease_refresh_seconds_bucket\{le="1"\}/ { le1 = $2 }
		/^broadcast_lease_refresh_seconds_count/ { n = $2 }
		END { print "lease_refreshes", n + 0; print "over_0.5s", n - le05; print "over_1s", n - le1 }'
}
# lease_summary BEFORE AFTER: what changed between two lease_counts.
lease_summary() {
	awk 'NR == FNR { before[$1] = $2; next } { d = $2 - before[$1]; if ($1 !~ /^ended_/) { s = s sprintf(", %s %d", $1, d) } else if (d > 0) { e = e sprintf(" %s %d", substr($1, 7), d) } }
		END { printf "sessions ended:%s%s", (e == "" ? " none" : e), s }' <(echo "$1") <(echo "$2")
}

cp auth.conf "$WORK/auth.conf"
load_dotenv # the operator user of nats.conf, for the CLI
unset NATS_USER NATS_PASSWORD
svc_password() { sed -n "s/^$1: .*NATS_PASSWORD=\([^ ]*\) .*/\1/p" Procfile; }
declare -A PPORT
printf 'bin\tround\taccounts\trecipients\trate\tstate\tseconds\trecipients_per_s\tload_1_5_15' >"$OUT"
for s in "${SVCS[@]}"; do printf '\t%s_us_per_recipient' "$s" >>"$OUT"; done
printf '\ttotal_us_per_recipient' >>"$OUT"
for s in "${SVCS[@]}"; do printf '\t%s_idle_cores' "$s" >>"$OUT"; done
printf '\tidle_load_1_5_15' >>"$OUT"
for s in "${SVCS[@]}"; do printf '\t%s_rw_calls_per_recipient' "$s" >>"$OUT"; done
printf '\n' >>"$OUT"

# run BIN ROUND N RATE: one fresh stack, its idle CPU, one task.
run() {
	local bin=$1 round=$2 n=$3 rate=$4 port s id t0 t1 c0 c1 i0 i1 io0 io1 ld ild acct line rps burst mport="" leases0=""
	rm -rf "$WORK/store"
	port=$(free_port 14622)
	PPORT[nats-server]=$(free_port $((port + 100)))
	# nats.conf's settings with their own port and store, no monitoring port.
	cat >"$WORK/nats.conf" <<EOF
server_name: proc-cost
host: 127.0.0.1
port: $port
max_payload: 8MB
jetstream { store_dir: "$WORK/store" }
include ./auth.conf
EOF
	((PROFILE == 0)) || echo "prof_port: ${PPORT[nats-server]}" >>"$WORK/nats.conf"
	export NATS_URL="nats://127.0.0.1:$port"
	nats_init "$WORK/natscli" 10s
	"$WORK/nats-server" -c "$WORK/nats.conf" >>"$WORK/nats-server.log" 2>&1 &
	P[nats-server]=$!
	wait_for 30 "nats-server" nats_ kv ls --names
	NATS_USER=admin NATS_PASSWORD="$(svc_password setup)" "$bin" setup >>"$WORK/setup.log" 2>&1
	local k=0
	for s in ingest render dispatch status; do
		local extra=(DASHBOARD_ADDR=off)
		k=$((k + 1))
		if [[ $s == status ]] && ((DASHBOARD)); then extra=(DASHBOARD_ADDR="127.0.0.1:$(free_port 18680)"); fi
		if [[ $s == dispatch ]] && ((ACCOUNTS > 1)); then
			mport=$(free_port 18780)
			extra+=(METRICS_ADDR="127.0.0.1:$mport")
		fi
		if ((PROFILE)); then
			PPORT[$s]=$(free_port $((PPORT[nats-server] + 10 * k)))
			extra+=(PPROF_ADDR="127.0.0.1:${PPORT[$s]}")
		fi
		# shellcheck disable=SC2086
		env NATS_USER=$s NATS_PASSWORD="$(svc_password "$s")" LOG_FORMAT=json LOG_LEVEL=warn "${extra[@]}" $SVC_ENV \
			"$bin" "$s" >>"$WORK/$s.log" 2>&1 &
		P[$s]=$!
	done
	wait_for 60 "the services" services_ready
	rps=1000000 burst=100000
	if ((rate > 0)); then rps=$rate burst=$((rate / 10 > 0 ? rate / 10 : 1)); fi
	local accts=() a
	if ((ACCOUNTS == 1)); then
		accts=(sbx)
	else
		rps=$(awk -v r="$rps" -v n="$ACCOUNTS" 'BEGIN { printf "%g", r / n }')
		burst=$(awk -v r="$rps" 'BEGIN { b = int(r / 10); print (b > 0 ? b : 1) }')
		for ((a = 1; a <= ACCOUNTS; a++)); do accts+=("$(printf 'sbx-%04d' "$a")"); done
	fi
	for acct in "${accts[@]}"; do
		printf '%s %s\n' "$acct" "{\"channel\":\"sandbox\",\"rate_per_sec\":$rps,\"burst\":$burst,\"concurrency\":256}"
	done | put_accounts
	wait_for 120 "dispatch to take the accounts" has_consumer JOBS "dispatch-${accts[-1]}"
	# The accounts' first sessions idle out after 10 s; then they sleep.
	wait_for 120 "the accounts to sleep" no_account_leases
	wait_for 120 "the accounts' asleep marks" all_accounts_asleep "${#accts[@]}"
	id="pc-$round-$n-$rate-$(date +%s%N)"
	jq -cn --arg id "$id" --argjson pool "$(printf '%s\n' "${accts[@]}" | jq -R . | jq -cs .)" \
		'{id: $id, channel: "sandbox", recipients_object: "lists/proc-cost.jsonl",
		template: "Hello {{.name}}, your code is 1234."} + (if ($pool | length) > 1 then {accounts: $pool} else {} end)' >"$WORK/task.json"
	awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "{\"to\":\"+86139%08d\",\"vars\":{\"name\":\"u%d\"}}\n", i, i }' >"$WORK/list.jsonl"
	nats_ object put broadcast_recipients "$WORK/list.jsonl" --name lists/proc-cost.jsonl --force >/dev/null

	lock
	ild=$(load)
	profile_all "idle-$n-$rate-r$round-$(basename "$bin")"
	i0=$(snapshot)
	sleep "$IDLE"
	i1=$(snapshot)
	profile_wait
	ld=$(load)
	[[ -z "$mport" ]] || leases0=$(lease_counts "$mport")
	c0=$(snapshot)
	io0=$(iosnapshot)
	t0=$(date +%s%N)
	publish_task "$WORK/task.json" >/dev/null 2>&1 || die "could not publish the task"
	profile_all "run-$n-$rate-r$round-$(basename "$bin")"
	STATE=""
	for _ in $(seq 6000); do
		STATE=$(get_progress "$id" | jq -r '.state // ""') || true
		is_final "$STATE" && break
		still_running "during the task"
		sleep 0.1
	done
	c1=$(snapshot)
	io1=$(iosnapshot)
	t1=$(date +%s%N)
	profile_wait
	unlock
	[[ "$STATE" == succeeded ]] || log "task $id is '$STATE', not succeeded"
	log "peak RSS (MB):$(for s in "${SVCS[@]}"; do awk -v s="$s" '/^VmHWM:/ { printf " %s %d", s, $2 / 1024 }' "/proc/${P[$s]}/status" 2>/dev/null; done)"
	[[ -z "$mport" ]] || log "dispatch during the task: $(lease_summary "$leases0" "$(lease_counts "$mport")")"
	line=$(awk -v bin="$(basename "$bin")" -v r="$round" -v accts="$ACCOUNTS" -v n="$n" -v rate="$rate" -v st="$STATE" -v t0="$t0" -v t1="$t1" -v ld="$ld" -v ild="$ild" \
		-v c0="$c0" -v c1="$c1" -v i0="$i0" -v i1="$i1" -v io0="$io0" -v io1="$io1" -v tck="$TCK" -v idle="$IDLE" 'BEGIN {
		secs = (t1 - t0) / 1e9
		split(c0, a, " "); split(c1, b, " "); split(i0, x, " "); split(i1, y, " ")
		printf "%s\t%s\t%d\t%d\t%s\t%s\t%.1f\t%.0f\t%s", bin, r, accts, n, rate, st, secs, n / secs, ld
		tot = 0
		for (k = 1; k <= 5; k++) { u = (b[k] - a[k]) / tck * 1e6 / n; tot += u; printf "\t%.1f", u }
		printf "\t%.1f", tot
		for (k = 1; k <= 5; k++) printf "\t%.4f", (y[k] - x[k]) / tck / idle
		printf "\t%s", ild
		split(io0, p, " "); split(io1, q, " ")
		for (k = 1; k <= 5; k++) printf "\t%.2f", (q[k] - p[k]) / n
		printf "\n"
	}')
	echo "$line" >>"$OUT"
	log "$(awk -F'\t' -v names="${SVCS[*]}" '{
		split(names, nm, " ")
		s = sprintf("%s round %s: %d account(s), %d at rate %s: %s in %ss (%s/s, load %s); µs per recipient:", $1, $2, $3, $4, $5, $6, $7, $8, $9)
		for (k = 1; k <= 5; k++) s = s sprintf(" %s %s", nm[k], $(9 + k))
		s = s sprintf(" total %s; idle cores (load %s):", $15, $21)
		for (k = 1; k <= 5; k++) s = s sprintf(" %s %s", nm[k], $(15 + k))
		s = s "; read/write calls per recipient:"
		for (k = 1; k <= 5; k++) s = s sprintf(" %s %s", nm[k], $(21 + k))
		print s }' <<<"$line")"
	for s in "${SVCS[@]}"; do kill -KILL "${P[$s]}" 2>/dev/null || true; done
	for s in "${SVCS[@]}"; do wait "${P[$s]}" 2>/dev/null || true; done
	P=()
}

for ((r = 1; r <= ROUNDS; r++)); do
	for rate in $RATES; do
		for n in $NS; do
			for b in $BINS; do
				log "round $r: $n recipients at rate $rate ($b)"
				run "$b" "$r" "$n" "$rate"
			done
		done
	done
done
column -t -s $'\t' "$OUT"
