#!/usr/bin/env bash
# Sends one task of N recipients (default 1,000,000) from a JSONL list in the
# broadcast_recipients object store through the sandbox channel, with
# nats-server and the four services as separate processes, and reports each
# service's peak RSS (VmHWM) and the end-to-end rate.
#   bash scripts/million.sh [N]
# Requires the nats CLI (go install github.com/nats-io/natscli/nats@v0.5.0).
set -euo pipefail
N="${1:-1000000}"
LIMIT_MB="${LIMIT_MB:-150}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$(go env GOPATH)/bin:$PATH"
WORK="$(mktemp -d /tmp/broadcast-million.XXXXXX)"
PORT="${PORT:-14333}"
export NATS_URL="nats://127.0.0.1:$PORT"
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

echo "million: building"
go build -o "$WORK/broadcast" ./cmd/broadcast
go build -o "$WORK/nats-server" github.com/nats-io/nats-server/v2

"$WORK/nats-server" -js -sd "$WORK/store" -a 127.0.0.1 -p "$PORT" >"$WORK/nats.log" 2>&1 &
PIDS+=($!)
NATS=(nats --server "$NATS_URL")
for _ in $(seq 100); do "${NATS[@]}" server check connection >/dev/null 2>&1 && break; sleep 0.1; done
"$WORK/broadcast" setup >"$WORK/setup.log"

declare -A SVC
for s in ingest render dispatch status; do
	DASHBOARD_ADDR=off LOG_FORMAT=json LOG_LEVEL=warn "$WORK/broadcast" "$s" >"$WORK/$s.log" 2>&1 &
	SVC[$s]=$!
	PIDS+=($!)
done
for _ in $(seq 100); do "${NATS[@]}" kv ls broadcast_accounts >/dev/null 2>&1 && break; sleep 0.2; done

echo "million: writing a $N-line JSONL list"
awk -v n="$N" 'BEGIN { for (i = 0; i < n; i++) printf "{\"to\":\"+86139%08d\",\"vars\":{\"name\":\"u%d\"}}\n", i, i }' >"$WORK/list.jsonl"
"${NATS[@]}" object put broadcast_recipients "$WORK/list.jsonl" --name lists/million.jsonl --force >/dev/null
"${NATS[@]}" kv put broadcast_accounts sbx '{"channel":"sandbox","rate_per_sec":1000000,"burst":100000,"concurrency":256}' >/dev/null
sleep 1

ID="million-$(date +%s)"
START=$(date +%s.%N)
"${NATS[@]}" pub broadcast.tasks --no-templates "{\"id\":\"$ID\",\"channel\":\"sandbox\",\"template\":\"Hello {{.name}}\",\"recipients_object\":\"lists/million.jsonl\"}" >/dev/null
peak() { awk '/VmHWM/ {print int($2/1024)}' "/proc/$1/status" 2>/dev/null || echo 0; }
STATE=""
while :; do
	P="$("${NATS[@]}" kv get --raw broadcast_progress "$ID" 2>/dev/null || true)"
	STATE="$(jq -r '.state // ""' <<<"${P:-{\}}" 2>/dev/null || true)"
	printf '\rmillion: %-11s sent %s / %s   ' "$STATE" "$(jq -r '.sent // 0' <<<"${P:-{\}}")" "$(jq -r '.total // 0' <<<"${P:-{\}}")"
	case "$STATE" in succeeded | partial | failed | cancelled | rejected) break ;; esac
	for s in "${!SVC[@]}"; do kill -0 "${SVC[$s]}" 2>/dev/null || { echo; echo "million: $s died"; tail -20 "$WORK/$s.log"; exit 1; }; done
	sleep 2
done
END=$(date +%s.%N)
echo
jq -c '{state,total,duplicates,sent,failed,skipped,rate_per_sec}' <<<"$P"
ELAPSED=$(awk -v a="$START" -v b="$END" 'BEGIN { printf "%.1f", b - a }')
echo "million: $N recipients in ${ELAPSED}s ($(awk -v n="$N" -v e="$ELAPSED" 'BEGIN { printf "%.0f", n / e }') recipients/s)"
FAIL=0
for s in ingest render dispatch status; do
	mb=$(peak "${SVC[$s]}")
	verdict=ok
	if ((mb > LIMIT_MB)); then verdict="OVER ${LIMIT_MB} MB"; FAIL=1; fi
	echo "million: peak RSS $s ${mb} MB ($verdict)"
done
echo "million: peak RSS nats-server $(peak "${PIDS[0]}") MB"
SENT=$(jq -r .sent <<<"$P")
if [[ "$STATE" != succeeded || "$SENT" != "$N" ]]; then echo "million: expected succeeded with $N sent"; FAIL=1; fi
exit $FAIL
