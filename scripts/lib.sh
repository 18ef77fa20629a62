# shellcheck shell=bash
# What scripts/smoke.sh and scripts/chaos.sh share. Source it after setting
# SCRIPT (the prefix of every line, e.g. "smoke") and ROOT (the repository);
# it only defines functions and the counters below, and runs nothing.
#
#   messages     log, die
#   setup        need, find_nats_cli (NATS_BIN), load_dotenv (OP_USER,
#                OP_PASSWORD), nats_init (NATS_CLI), nats_
#   ports        port_in_use, free_port
#   processes    start, kill9, restart, running, stop_all (by name, in PID
#                and CMD, logs in LOG_DIR), stop_group (by process group)
#   waiting      wait_for, since
#   the stack    has_consumer, services_ready, publish_task, get_progress,
#                is_final, wait_final
#   checks       report, expect, and PASSED / FAILED
#   logs         print_log_tails
#
# A script that defines still_running (a function that dies when a process
# the run needs has exited) has it called on every turn of wait_for and
# wait_final.

FATAL=0
PASSED=0
FAILED=0
EMPTY='{}'
declare -A PID CMD

# ---------------------------------------------------------------- messages
log() { printf '%s: %s\n' "$SCRIPT" "$*"; }
# die MESSAGE: print it on stderr, mark the run fatal and exit 1 (the
# script's EXIT trap then cleans up).
die() {
	printf '%s: FATAL: %s\n' "$SCRIPT" "$*" >&2
	# shellcheck disable=SC2034 # read by the scripts' cleanup
	FATAL=1
	exit 1
}

# ---------------------------------------------------------------- setup
# need COMMAND HOW: die unless COMMAND is on PATH, saying HOW to get it.
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found ($2)"; }

# find_nats_cli: NATS_BIN is the nats CLI, on PATH or in $(go env GOPATH)/bin.
find_nats_cli() {
	NATS_BIN="$(command -v nats 2>/dev/null || true)"
	[[ -n "$NATS_BIN" ]] || NATS_BIN="$(go env GOPATH)/bin/nats"
	[[ -x "$NATS_BIN" ]] || die "nats CLI not found: go install github.com/nats-io/natscli/nats@v0.5.0"
}

# load_dotenv: export what $ROOT/.env sets (the `operator` user of
# nats.conf, for people and the CLI; foreman loads it too) after dropping
# any NATS_* credentials of the caller's own, and keep the operator in
# OP_USER and OP_PASSWORD.
load_dotenv() {
	[[ -f "$ROOT/.env" ]] || die "$ROOT/.env (operator credentials) is missing"
	unset NATS_USER NATS_PASSWORD NATS_CREDS NATS_CONTEXT || true
	set -a
	# shellcheck source=/dev/null
	. "$ROOT/.env"
	set +a
	[[ -n "${NATS_USER:-}" && -n "${NATS_PASSWORD:-}" ]] || die ".env must set NATS_USER and NATS_PASSWORD"
	OP_USER=$NATS_USER
	OP_PASSWORD=$NATS_PASSWORD
}

# nats_init CONFIG_DIR TIMEOUT: NATS_CLI is the nats CLI against NATS_URL as
# the operator, with CONFIG_DIR (made empty) as its configuration, so a
# developer's selected context (credentials, other servers) never leaks
# in; nats_ adds TIMEOUT to every request. Call it once NATS_URL is known.
nats_init() {
	mkdir -p "$1"
	NATS_CLI=(env XDG_CONFIG_HOME="$1" "$NATS_BIN" --server "$NATS_URL" --user "$OP_USER" --password "$OP_PASSWORD")
	NATS_TIMEOUT=$2
}
# nats_ ARGS...: one nats CLI command (see nats_init).
nats_() { "${NATS_CLI[@]}" --timeout "$NATS_TIMEOUT" "$@"; }

# ---------------------------------------------------------------- ports
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# free_port FROM: the first port from FROM that nothing listens on.
free_port() {
	local p=$1
	while port_in_use "$p"; do p=$((p + 1)); done
	echo "$p"
}

# ---------------------------------------------------------------- processes
# start NAME CMD...: run CMD in its own process group, appending its output
# to $LOG_DIR/NAME.log; PID[NAME] is the group, CMD[NAME] the command.
start() {
	local name=$1
	shift
	CMD[$name]="$*"
	printf '=== %s: start %s at %s\n' "$SCRIPT" "$name" "$(date +%T.%N | cut -c1-12)" >>"$LOG_DIR/$name.log"
	setsid "$@" >>"$LOG_DIR/$name.log" 2>&1 </dev/null &
	PID[$name]=$!
}
# kill9 NAME: SIGKILL the process group and wait until it is gone.
kill9() {
	local name=$1 i
	kill -KILL -- "-${PID[$name]}" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		kill -0 "${PID[$name]}" 2>/dev/null || break
		sleep 0.05
	done
	wait "${PID[$name]}" 2>/dev/null || true
	printf '=== %s: killed %s (kill -9) at %s\n' "$SCRIPT" "$name" "$(date +%T.%N | cut -c1-12)" >>"$LOG_DIR/$name.log"
}
# restart NAME: start NAME again with the command it was started with.
restart() {
	local name=$1
	# shellcheck disable=SC2086
	start "$name" ${CMD[$name]}
}
running() { kill -0 "${PID[$1]}" 2>/dev/null; }
# stop_all: SIGKILL every process started with start.
stop_all() {
	local name
	for name in "${!PID[@]}"; do
		kill -KILL -- "-${PID[$name]}" 2>/dev/null || true
	done
}
# stop_group PGID NAME: TERM the process group, wait up to 15 s, then KILL it.
stop_group() {
	local pgid=$1 name=$2 i
	[[ -n "$pgid" ]] || return 0
	kill -0 -- "-$pgid" 2>/dev/null || return 0
	kill -TERM -- "-$pgid" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		kill -0 -- "-$pgid" 2>/dev/null || return 0
		sleep 0.1
	done
	log "$name did not stop after SIGTERM; sending SIGKILL"
	kill -KILL -- "-$pgid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 -- "-$pgid" 2>/dev/null || return 0
		sleep 0.1
	done
}

# ---------------------------------------------------------------- waiting
# wait_for SECONDS WHAT CMD...: run CMD every WAIT_INTERVAL seconds (default
# 0.5) until it succeeds; die when SECONDS have passed.
wait_for() {
	local secs=$1 what=$2
	shift 2
	local deadline=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		if declare -F still_running >/dev/null; then still_running "while waiting for $what"; fi
		(($(date +%s) < deadline)) || die "timed out after ${secs}s waiting for $what"
		sleep "${WAIT_INTERVAL:-0.5}"
	done
}
# since T0_NS: seconds since T0_NS (from date +%s%N), one decimal.
since() {
	local ms=$((($(date +%s%N) - $1) / 1000000))
	printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100))
}

# ---------------------------------------------------------------- the stack
has_consumer() { nats_ consumer ls "$1" --names 2>/dev/null | grep -qx "$2"; }
services_ready() {
	has_consumer TASKS ingest && has_consumer RENDER render && has_consumer EVENTS status
}
# publish_task FILE: publish FILE on broadcast.tasks through JetStream (so a
# task that is not stored fails loudly), natscli templates off (the task's
# own template uses {{ }}).
publish_task() {
	nats_ pub --jetstream --no-templates --force-stdin broadcast.tasks <"$1"
}
# get_progress TASK: the task's progress JSON; fails when there is none.
get_progress() { nats_ kv get --raw broadcast_progress "$1" 2>/dev/null; }
is_final() {
	case "$1" in succeeded | partial | failed | cancelled | rejected) return 0 ;; esac
	return 1
}
# wait_final TASK SECONDS EVERY T0_NS: poll TASK's progress every 0.5 s until
# its state is final or SECONDS pass, printing it every EVERY seconds with
# the time since T0_NS. Leaves the last progress read in PROGRESS ({} when
# none) and its state in STATE; the caller judges STATE.
wait_final() {
	local task=$1 secs=$2 every=$3 t0=$4 p now last=0
	local deadline=$(($(date +%s) + secs))
	PROGRESS=$EMPTY
	STATE=""
	while :; do
		if p=$(get_progress "$task") && [[ -n "$p" ]]; then
			PROGRESS=$p
			STATE=$(jq -r '.state // ""' <<<"$p")
		fi
		now=$(date +%s)
		if is_final "$STATE" || ((now - last >= every)); then
			if [[ "$PROGRESS" != "$EMPTY" ]]; then
				jq -r --arg s "$SCRIPT" --arg t "$(since "$t0")" \
					'"\($s):   [\($t)s] \(.state) total=\(.total) sent=\(.sent) retrying=\(.retrying) failed=\(.failed) skipped=\(.skipped) rate=\(.rate_per_sec * 10 | round / 10)/s"' <<<"$PROGRESS"
			else
				log "  waiting for progress of $task"
			fi
			last=$now
		fi
		is_final "$STATE" && return 0
		if ((now >= deadline)); then
			log "task $task not final after ${secs}s (state '${STATE:-none}')"
			return 0
		fi
		if declare -F still_running >/dev/null; then still_running "while the task was running"; fi
		sleep 0.5
	done
}

# ---------------------------------------------------------------- checks
# report NAME [FAILURE...]: a check passes when no failure messages are given.
report() {
	local name=$1
	shift
	if (($# == 0)); then
		PASSED=$((PASSED + 1))
		log "PASS $name"
	else
		FAILED=$((FAILED + 1))
		log "FAIL $name"
		local m
		for m in "$@"; do printf '        %s\n' "$m"; done
	fi
}
# expect ARRAY LABEL WANT GOT: append "LABEL: expected WANT, got GOT" to ARRAY on mismatch.
expect() {
	local -n _errs=$1
	if [[ "$3" != "$4" ]]; then
		_errs+=("$2: expected $3, got $4")
	fi
}

# ---------------------------------------------------------------- logs
# print_log_tails LINES FILE...: the last LINES lines of each FILE that exists.
print_log_tails() {
	local n=$1 f
	shift
	for f in "$@"; do
		[[ -f "$f" ]] || continue
		printf '\n----- %s (last %d lines) -----\n' "${f#"$ROOT"/}" "$n"
		tail -n "$n" "$f"
	done
}
