#!/usr/bin/env bash
# Optional, manual: compares Broadcast's smtp channel with listmonk on the
# same counting SMTP sink (internal/fakes/smtpsink), in alternating runs
# (listmonk, Broadcast, listmonk, ...). Not part of CI or `go test`.
#   bash scripts/compare-listmonk.sh /path/to/listmonk [ROUNDS]
# Needs: a listmonk binary (built from source; its admin UI is not needed),
# a running PostgreSQL whose database is listmonk's alone (PGHOST, PGPORT,
# PGUSER, PGPASSWORD, PGDATABASE; `listmonk --install` WIPES it), psql, the
# nats CLI (natscli v0.5.0), jq, curl, flock, a populated Go module cache
# (nothing is downloaded: GOPROXY=off), root or the postgres user (to read
# /proc/<pid>/stat of the postgres processes; PG_PID names the postmaster,
# else ss finds it by PGPORT). Knobs: N (20000), ROUNDS (2),
# LM_CONCURRENCY ("10 64"), BC_CONCURRENCY ("16 64"; "" skips a system),
# BC_DEPTH (1: a connection per message in flight, as listmonk's
# max_conns; D: the account's "connections" is concurrency/D, so each
# connection carries up to D transactions at once),
# BC_AUTH (1: nats.conf's users as in the Procfile; 0: none), SINK_CHUNKING
# (1: the sink offers CHUNKING, as Postfix does; 0: not, so Broadcast sends
# DATA as listmonk does), BENCH_LOCK (/tmp/bench.lock, taken around each
# measured run; "" for none), PROFILE (0; 1: CPU profiles of nats-server
# and the services over PROFILE_SECS (8) from each Broadcast run's submit,
# with their allocations over the same time (*.allocs.pprof), in
# $WORK/prof; the profiling costs a little CPU, so keep those runs out of
# the table), MONITOR (0; 1: the server's monitoring port, and each
# Broadcast run's messages per recipient into and out of the server by
# connection name, from /connz, in $WORK/msgs.txt), BC_BINS (paths of
# broadcast binaries to run one after the other in each round, for an A/B
# of two builds; default: one built from this tree), OUT.
# Everything listens on 127.0.0.1 only. docs/performance.md has the figures.
set -euo pipefail

LISTMONK_BIN="$(realpath "${1:?usage: compare-listmonk.sh LISTMONK_BINARY [ROUNDS]}")"
ROUNDS="${2:-${ROUNDS:-2}}"
N="${N:-20000}"
LM_CONCURRENCY="${LM_CONCURRENCY-10 64}"
BC_CONCURRENCY="${BC_CONCURRENCY-16 64}"
BC_DEPTH="${BC_DEPTH:-1}"
BC_NAME=broadcast
((BC_DEPTH > 1)) && BC_NAME="broadcast-depth$BC_DEPTH"
BC_AUTH="${BC_AUTH:-1}"
SINK_CHUNKING="${SINK_CHUNKING:-1}"
BENCH_LOCK="${BENCH_LOCK-/tmp/bench.lock}"
PROFILE="${PROFILE:-0}"
MONITOR="${MONITOR:-0}"
PROFILE_SECS="${PROFILE_SECS:-8}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SCRIPT=compare
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

need psql "apt-get install -y postgresql-client"
need jq "apt-get install -y jq"
need curl "apt-get install -y curl"
need flock "util-linux"
find_nats_cli
[[ -x "$LISTMONK_BIN" ]] || die "$LISTMONK_BIN is not executable"
: "${PGHOST:?set PGHOST (and PGPORT, PGUSER, PGPASSWORD, PGDATABASE) to the database of listmonk}"
: "${PGDATABASE:?set PGDATABASE}" "${PGUSER:?set PGUSER}"
psql -Atqc 'select 1' >/dev/null || die "cannot reach PostgreSQL at $PGHOST:${PGPORT:-5432}"

WORK="$(mktemp -d /tmp/compare-listmonk.XXXXXX)"
OUT="${OUT:-$WORK/results.tsv}"
LOG_DIR="$WORK"
SINK_PID=""
LM_PID=""
BC_PIDS=()
cleanup() {
	local p
	for p in "${BC_PIDS[@]}" $LM_PID $SINK_PID; do kill -KILL "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK/bc-store" "$WORK/listmonk.token"
	log "logs and results in $WORK"
}
trap cleanup EXIT

# ---------------------------------------------------------------- build (outside the lock)
log "building broadcast, nats-server and smtpsink (GOPROXY=off)"
export GOPROXY=off GOFLAGS="${GOFLAGS:--buildvcs=false}"
go build -o "$WORK/broadcast" ./cmd/broadcast
go build -o "$WORK/nats-server" github.com/nats-io/nats-server/v2
go build -o "$WORK/smtpsink" ./internal/fakes/smtpsink
read -ra BC_BINS <<<"${BC_BINS:-$WORK/broadcast}"

# ---------------------------------------------------------------- measuring
TCK=$(getconf CLK_TCK)
# cpu_ticks PID...: utime+stime of each PID plus cutime+cstime (children it
# reaped), summed; a PID that is gone counts 0.
cpu_ticks() {
	local p s t=0
	for p in "$@"; do
		s=$(cat "/proc/$p/stat" 2>/dev/null) || continue
		s=${s##*) }
		# shellcheck disable=SC2086
		set -- $s
		t=$((t + ${12} + ${13} + ${14} + ${15}))
	done
	echo "$t"
}
# pg_ticks: the postmaster and every process it has now (backends come and
# go: the ones it reaped are in its cutime).
pg_ticks() {
	# shellcheck disable=SC2046
	cpu_ticks "$PG_MASTER" $(pgrep -P "$PG_MASTER")
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
# cpu_split NAME=PID...: "NAME=TICKS ..." for those processes (cpu-split.txt).
cpu_split() {
	local a out=""
	for a in "$@"; do out+="${a%%=*}=$(cpu_ticks "${a#*=}") "; done
	echo "$out"
}
# split_record SYSTEM CONC BEFORE AFTER: CPU µs per message of each process.
split_record() {
	local a b name out="$1 $2:"
	for a in $3; do
		name=${a%%=*}
		for b in $4; do [[ "${b%%=*}" == "$name" ]] && out+=" $name $(((${b#*=} - ${a#*=}) * 1000000 / TCK / N))"; done
	done
	echo "$out µs/msg" >>"$WORK/cpu-split.txt"
}
# msgs_record SYSTEM CONC PORT: messages per recipient into and out of the
# server by connection name (the NATS CLI's connections are left out).
msgs_record() {
	curl -fsS "http://127.0.0.1:$3/connz?limit=1024" | jq -r --arg h "$1 $2:" --argjson n "$N" '
		[.connections[] | select((.name // "") | test("^NATS CLI") | not)]
		| group_by(.name // "?") | map({name: (.[0].name // "?"), in: (map(.in_msgs) | add), out: (map(.out_msgs) | add)})
		| $h + " " + (map("\(.name) in \(.in / $n * 100 | round / 100) out \(.out / $n * 100 | round / 100)") | join(", "))
		+ " (messages per recipient, from and to the server)"' >>"$WORK/msgs.txt" || log "connz: no figures"
}
lock() { if [[ -n "$BENCH_LOCK" ]]; then exec 9>"$BENCH_LOCK" && flock 9; fi; }
unlock() { if [[ -n "$BENCH_LOCK" ]]; then exec 9>&-; fi; }

# start_sink SYSTEM: a fresh counting sink, which keeps the first message
# in sample-SYSTEM.eml; SINK_PORT is its port.
start_sink() {
	: >"$WORK/sink.out"
	"$WORK/smtpsink" -n "$N" -chunking="$([[ $SINK_CHUNKING == 1 ]] && echo true || echo false)" -dump "$WORK/sample-$1.eml" >"$WORK/sink.out" 2>&1 &
	SINK_PID=$!
	wait_for 10 "the SMTP sink" grep -q '^addr ' "$WORK/sink.out"
	SINK_PORT=$(awk '/^addr /{split($2, a, ":"); print a[2]}' "$WORK/sink.out")
}
stop_sink() {
	kill -TERM "$SINK_PID" 2>/dev/null || true
	wait "$SINK_PID" 2>/dev/null || true
	SINK_PID=""
}
# wait_sink SECONDS: until the sink has accepted N; SINK_FIRST, SINK_LAST
# (ns) and SINK_DISTINCT.
wait_sink() {
	local deadline=$(($(date +%s) + $1)) l
	until l=$(grep '^done ' "$WORK/sink.out" 2>/dev/null); do
		(($(date +%s) < deadline)) || die "the sink did not count $N in $1 s"
		sleep 0.05
	done
	read -r _ SINK_FIRST SINK_LAST _ SINK_DISTINCT <<<"$l"
}
# record SYSTEM CONC T0 CPU0 CPU_AT_N CPU_FINAL LOAD
record() {
	local sys=$1 c=$2 t0=$3 c0=$4 c1=$5 c2=$6 ld=$7
	awk -v s="$sys" -v c="$c" -v n="$N" -v t0="$t0" -v f="$SINK_FIRST" -v l="$SINK_LAST" \
		-v c0="$c0" -v c1="$c1" -v c2="$c2" -v tck="$TCK" -v ld="$ld" -v d="$SINK_DISTINCT" 'BEGIN {
		span = (l - f) / 1e9; total = (l - t0) / 1e9
		printf "%s\t%s\t%d\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%d\t%s\n", s, c, n, n / span, n / total, (f - t0) / 1e9,
			(c1 - c0) / tck * 1e6 / n, (c2 - c0) / tck * 1e6 / n, d, ld
	}' | tee -a "$OUT"
}
printf 'system\tconcurrency\tmessages\tmsgs_per_s_first_to_last\tmsgs_per_s_from_start\tfirst_after_s\tcpu_us_per_msg_at_n\tcpu_us_per_msg_final\tdistinct\tload_1_5_15\n' | tee "$OUT"

# ---------------------------------------------------------------- listmonk
LM_PORT=$(free_port 19900)
LM_URL="http://127.0.0.1:$LM_PORT"
cat >"$WORK/listmonk.toml" <<EOF
[app]
address = "127.0.0.1:$LM_PORT"
[db]
host = "$PGHOST"
port = ${PGPORT:-5432}
user = "$PGUSER"
password = "${PGPASSWORD:-}"
database = "$PGDATABASE"
ssl_mode = "disable"
max_open = 25
max_idle = 25
max_lifetime = "300s"
params = ""
EOF
chmod 600 "$WORK/listmonk.toml"

log "installing listmonk's schema into $PGDATABASE (wipes it)"
# The API token goes to a private file, never to the output.
(cd "$WORK" && LISTMONK_ADMIN_USER=admin LISTMONK_ADMIN_PASSWORD="$(head -c 12 /dev/urandom | base64)" \
	LISTMONK_ADMIN_API_USER=bench "$LISTMONK_BIN" --config "$WORK/listmonk.toml" --install --yes \
	>"$WORK/listmonk-install.log" 2>"$WORK/listmonk-install.err") || die "listmonk --install failed (see $WORK/listmonk-install.log)"
umask 077
sed -n 's/^export LISTMONK_ADMIN_API_TOKEN="\(.*\)"$/Authorization: token bench:\1/p' "$WORK/listmonk-install.err" >"$WORK/listmonk.token"
rm -f "$WORK/listmonk-install.err"
umask 022
[[ -s "$WORK/listmonk.token" ]] || die "no API token from listmonk --install"
api() { # api METHOD PATH [JSON]
	local body=()
	(($# < 3)) || body=(--data-binary "$3")
	curl -fsS -X "$1" -H @"$WORK/listmonk.token" -H 'Content-Type: application/json' "${body[@]}" "$LM_URL$2"
}

(cd "$WORK" && exec "$LISTMONK_BIN" --config "$WORK/listmonk.toml" >>"$WORK/listmonk.log" 2>&1) &
LM_PID=$! # the subshell execs listmonk: the same pid
wait_for 60 "listmonk" curl -fsS "$LM_URL/health"
# The postmaster: PG_PID, or the process listening on PGPORT (needs ss).
PG_MASTER=${PG_PID:-$(ss -Hltnp "sport = :${PGPORT:-5432}" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)}
[[ -r "/proc/$PG_MASTER/stat" ]] || die "cannot read the postmaster's /proc/$PG_MASTER/stat"
log "listmonk $("$LISTMONK_BIN" --version 2>/dev/null | head -1) on $LM_URL, pid $LM_PID; postmaster pid $PG_MASTER ($(psql -Atqc 'show server_version'))"

LIST_ID=$(api POST /api/lists '{"name":"compare","type":"private","optin":"single"}' | jq -r .data.id)
TPL_ID=$(api POST /api/templates '{"name":"bare","type":"campaign","body":"{{ template \"content\" . }}"}' | jq -r .data.id)
log "inserting $N subscribers into list $LIST_ID"
psql -qv ON_ERROR_STOP=1 <<EOF
INSERT INTO subscribers (uuid, email, name, status)
  SELECT gen_random_uuid(), 'user' || i || '@example.org', 'User ' || i, 'enabled' FROM generate_series(1, $N) i;
INSERT INTO subscriber_lists (subscriber_id, list_id, status)
  SELECT id, $LIST_ID, 'confirmed' FROM subscribers WHERE email LIKE 'user%@example.org';
ANALYZE subscribers;
ANALYZE subscriber_lists;
EOF

# lm_settings CONC: listmonk's settings for one run: CONC workers and as many
# SMTP connections to the sink; message_rate (messages per worker before it
# sleeps a second) above any worker's share of N; no update checks.
lm_settings() {
	local c=$1 rate=$(((3 * N / $1) > 1000 ? 3 * N / $1 : 1000)) s
	s=$(api GET /api/settings | jq -c --argjson c "$c" --argjson rate "$rate" --argjson port "$SINK_PORT" '.data
		| .["app.concurrency"] = $c | .["app.message_rate"] = $rate | .["app.batch_size"] = 1000
		| .["app.check_updates"] = false | .["app.root_url"] = "http://127.0.0.1"
		| .smtp = [.smtp[0] | .enabled = true | .host = "127.0.0.1" | .port = $port | .auth_protocol = "none"
			| .username = "" | .tls_type = "none" | .tls_skip_verify = false | .max_conns = $c
			| .max_msg_retries = 2 | .idle_timeout = "15s" | .wait_timeout = "5s" | .hello_hostname = ""]')
	api PUT /api/settings "$s" >/dev/null
	sleep 2 # listmonk restarts itself in the same process
	wait_for 60 "listmonk after its settings changed" curl -fsS "$LM_URL/health"
	[[ "$(api GET /api/settings | jq '[.data["app.concurrency"], .data.smtp[0].port]' -c)" == "[$c,$SINK_PORT]" ]] ||
		die "listmonk did not take the settings"
}

run_listmonk() {
	local c=$1 id t0 c0 c1 c2 ld st s0 s2
	start_sink listmonk
	lm_settings "$c"
	id=$(api POST /api/campaigns "$(jq -cn --argjson l "$LIST_ID" --argjson t "$TPL_ID" --arg name "compare-$c-$(date +%s%N)" '{
		name: $name, subject: "Hello", lists: [$l], from_email: "Bench <bench@example.org>",
		content_type: "plain", messenger: "email", type: "regular", template_id: $t,
		body: "Hello {{ .Subscriber.Name }}, this is the benchmark message."}')" | jq -r .data.id)
	sleep 1
	lock
	ld=$(load)
	s0="listmonk=$(cpu_ticks "$LM_PID") postgres=$(pg_ticks)"
	c0=$(($(cpu_ticks "$LM_PID") + $(pg_ticks)))
	t0=$(date +%s%N)
	api PUT "/api/campaigns/$id/status" '{"status":"running"}' >/dev/null
	wait_sink 300
	c1=$(($(cpu_ticks "$LM_PID") + $(pg_ticks)))
	st=""
	for _ in $(seq 600); do
		st=$(api GET "/api/campaigns/$id" | jq -r .data.status)
		[[ "$st" == finished ]] && break
		sleep 0.2
	done
	c2=$(($(cpu_ticks "$LM_PID") + $(pg_ticks)))
	s2="listmonk=$(cpu_ticks "$LM_PID") postgres=$(pg_ticks)"
	unlock
	split_record listmonk "$c" "$s0" "$s2"
	[[ "$st" == finished ]] || log "campaign $id is '$st', not finished"
	record listmonk "$c" "$t0" "$c0" "$c1" "$c2" "$ld"
	stop_sink
}

# ---------------------------------------------------------------- Broadcast
awk -v n="$N" 'BEGIN { for (i = 1; i <= n; i++) printf "{\"to\":\"user%d@example.org\",\"vars\":{\"name\":\"User %d\"}}\n", i, i }' >"$WORK/list.jsonl"
cp auth.conf "$WORK/auth.conf"
load_dotenv # the operator user of nats.conf, for the CLI
unset NATS_USER NATS_PASSWORD
# svc_password NAME: its development password, from the Procfile.
svc_password() { sed -n "s/^$1: .*NATS_PASSWORD=\([^ ]*\) .*/\1/p" Procfile; }

# run_broadcast CONC BINARY NAME
run_broadcast() {
	local c=$1 bin=$2 name=$3 port t0 c0 c1 c2 ld s id s0 s2 names
	start_sink broadcast
	rm -rf "$WORK/bc-store"
	port=$(free_port 14522)
	# nats.conf with its own port and store and without the monitoring port.
	cat >"$WORK/nats.conf" <<EOF
server_name: compare-listmonk
host: 127.0.0.1
port: $port
max_payload: 8MB
jetstream { store_dir: "$WORK/bc-store" }
EOF
	if ((BC_AUTH)); then echo 'include ./auth.conf' >>"$WORK/nats.conf"; fi
	declare -A pport=()
	if ((PROFILE)); then
		pport[nats-server]=$(free_port 16060)
		echo "prof_port: ${pport[nats-server]}" >>"$WORK/nats.conf"
	fi
	local mport=""
	if ((MONITOR)); then
		mport=$(free_port 18222)
		echo "http: 127.0.0.1:$mport" >>"$WORK/nats.conf"
	fi
	export NATS_URL="nats://127.0.0.1:$port"
	nats_init "$WORK/natscli" 10s
	BC_PIDS=()
	"$WORK/nats-server" -c "$WORK/nats.conf" >>"$WORK/nats.log" 2>&1 &
	BC_PIDS+=($!)
	names="nats-server=$!"
	wait_for 30 "nats-server" nats_ kv ls --names
	NATS_USER=admin NATS_PASSWORD="$(svc_password setup)" "$bin" setup >>"$WORK/setup.log" 2>&1
	for s in ingest render dispatch status; do
		local prof=()
		if ((PROFILE)); then
			pport[$s]=$(free_port $((pport[nats-server] + ${#pport[@]} * 10)))
			prof=(PPROF_ADDR="127.0.0.1:${pport[$s]}")
		fi
		env NATS_USER=$s NATS_PASSWORD="$(svc_password "$s")" DASHBOARD_ADDR=off LOG_FORMAT=json LOG_LEVEL=warn "${prof[@]}" \
			"$bin" "$s" >>"$WORK/$s.log" 2>&1 &
		BC_PIDS+=($!)
		names+=" $s=$!"
	done
	wait_for 60 "the services" services_ready
	nats_ object put broadcast_recipients "$WORK/list.jsonl" --name lists/compare.jsonl --force >/dev/null
	nats_ kv put broadcast_accounts sink "$(jq -cn --argjson port "$SINK_PORT" --argjson c "$c" '{
		channel: "smtp", host: "127.0.0.1", port: $port, tls: "none", from: "Bench <bench@example.org>",
		subject: "Hello", rate_per_sec: 1000000, burst: 100000, concurrency: $c,
		connections: ([1, ($c + '"$BC_DEPTH"' - 1) / '"$BC_DEPTH"' | floor] | max)}')" >/dev/null
	wait_for 60 "dispatch to take account sink" has_consumer JOBS dispatch-sink
	id="compare-$c-$(date +%s%N)"
	jq -cn --arg id "$id" '{id: $id, channel: "smtp", recipients_object: "lists/compare.jsonl",
		template: "Hello {{.name}}, this is the benchmark message."}' >"$WORK/task.json"
	sleep 1
	lock
	ld=$(load)
	s0=$(cpu_split $names)
	c0=$(cpu_ticks "${BC_PIDS[@]}")
	t0=$(date +%s%N)
	publish_task "$WORK/task.json" >/dev/null 2>&1
	local pjobs=()
	if ((PROFILE)); then
		mkdir -p "$WORK/prof"
		for s in "${!pport[@]}"; do
			curl -fsS -o "$WORK/prof/$name-$c-r$r-$s.pprof" "http://127.0.0.1:${pport[$s]}/debug/pprof/profile?seconds=$PROFILE_SECS" 2>>"$WORK/prof/curl.log" &
			pjobs+=($!)
			curl -fsS -o "$WORK/prof/$name-$c-r$r-$s.allocs.pprof" "http://127.0.0.1:${pport[$s]}/debug/pprof/allocs?seconds=$PROFILE_SECS" 2>>"$WORK/prof/curl.log" &
			pjobs+=($!)
		done
	fi
	wait_sink 300
	c1=$(cpu_ticks "${BC_PIDS[@]}")
	STATE=""
	for _ in $(seq 600); do
		STATE=$(get_progress "$id" | jq -r '.state // ""') || true
		is_final "$STATE" && break
		sleep 0.2
	done
	c2=$(cpu_ticks "${BC_PIDS[@]}")
	s2=$(cpu_split $names)
	for s in "${pjobs[@]}"; do wait "$s" || true; done
	unlock
	split_record "$name" "$c" "$s0" "$s2"
	if ((MONITOR)); then msgs_record "$name" "$c" "$mport"; fi
	[[ "$STATE" == succeeded ]] || log "task $id is '$STATE', not succeeded"
	record "$name" "$c" "$t0" "$c0" "$c1" "$c2" "$ld"
	for s in "${BC_PIDS[@]}"; do kill -KILL "$s" 2>/dev/null || true; done
	for s in "${BC_PIDS[@]}"; do wait "$s" 2>/dev/null || true; done
	BC_PIDS=()
	stop_sink
}

# ---------------------------------------------------------------- alternate
read -ra LMC <<<"$LM_CONCURRENCY"
read -ra BCC <<<"$BC_CONCURRENCY"
for ((r = 1; r <= ROUNDS; r++)); do
	for ((i = 0; i < ${#LMC[@]} || i < ${#BCC[@]}; i++)); do
		if ((i < ${#LMC[@]})); then log "round $r: listmonk, concurrency ${LMC[i]}"; run_listmonk "${LMC[i]}"; fi
		if ((i < ${#BCC[@]})); then
			for ((b = 0; b < ${#BC_BINS[@]}; b++)); do
				name=$BC_NAME
				((${#BC_BINS[@]} > 1)) && name+="-$(basename "${BC_BINS[b]}")"
				log "round $r: Broadcast ($name), concurrency ${BCC[i]}"
				run_broadcast "${BCC[i]}" "${BC_BINS[b]}" "$name"
			done
		fi
	done
done
log "results: $OUT"
column -t -s $'\t' "$OUT"
log "CPU by process, to the final state:"
cat "$WORK/cpu-split.txt"
if ((MONITOR)); then log "messages by connection:" && cat "$WORK/msgs.txt"; fi
