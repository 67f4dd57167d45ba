#!/usr/bin/env bash
# Durability benchmark for Warren alone:
#   1. durable + persistent 1 KB, 1 producer / 1 consumer, with confirms (window 100) and
#      without, same run;
#   2. a backlog of BACKLOG_GB (default 5) GB of persistent 1 KB messages with no consumer:
#      peak RSS while it fills;
#   3. SIGKILL, restart on the same data directory: recovery time and RSS, as logged;
#   4. drain the backlog with one consumer: peak RSS while it drains, and the rate.
#
#   bench/durability.sh                       # 5 GB backlog
#   BACKLOG_GB=1 bench/durability.sh          # quicker
#
# Needs about BACKLOG_GB + 1 GB free in DATA_ROOT (default /tmp).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BACKLOG_GB=${BACKLOG_GB:-5}
DURATION=${DURATION:-10}
PORT=${PORT:-5674}
DATA_ROOT=${DATA_ROOT:-/tmp}
DATA=$(mktemp -d "$DATA_ROOT/warren-durability.XXXXXX")
LOG=$DATA.log
URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
WARREN="$ROOT/target/release/warren"
PERF="$ROOT/target/release/warren-perf"
PID=""

cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
    rm -rf "$DATA"
}
trap cleanup EXIT

log() { echo "[durability] $*" >&2; }

start() {
    "$WARREN" --amqp-listen "127.0.0.1:$PORT" --management-listen 127.0.0.1:0 --httpmq-listen 127.0.0.1:0 --data-dir "$DATA" --log-level info >>"$LOG" 2>&1 &
    PID=$!
    for _ in $(seq 600); do
        (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
        sleep 0.1
    done
    log "warren did not start"; cat "$LOG"; exit 1
}

rss_mb() { awk '/VmRSS/ {printf "%d", $2/1024}' "/proc/$PID/status"; }

# Samples the broker's RSS every 0.5 s while "$@" runs; prints the peak in MB on fd 3.
with_peak_rss() {
    local peak=0 r
    "$@" &
    local job=$!
    while kill -0 "$job" 2>/dev/null; do
        r=$(rss_mb); [ "$r" -gt "$peak" ] && peak=$r
        sleep 0.5
    done
    wait "$job" || true  # warren-perf exits 2 when messages are still queued, as here
    echo "$peak" >&3
}

field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d['$1'])"; }

log "building (release)"
(cd "$ROOT" && cargo build --release -q -p warren-server -p warren-perf)
start
VERSION=$("$WARREN" --version)

log "1. durable 1p/1c, confirms vs none, ${DURATION}s each"
ON=$("$PERF" --uri "$URI" --persistent --confirm 100 --prefetch 100 --duration "$DURATION" --json)
OFF=$("$PERF" --uri "$URI" --persistent --prefetch 100 --duration "$DURATION" --json)
ON_RATE=$(echo "$ON" | field consume_rate_median)
OFF_RATE=$(echo "$OFF" | field consume_rate_median)
ON_LOST=$(echo "$ON" | field missing)/$(echo "$ON" | field duplicates)

MSGS=${BACKLOG_MSGS:-$((BACKLOG_GB * 1024 * 1024))}
log "2. filling a backlog of $MSGS persistent 1 KB messages"
BASE_RSS=$(rss_mb)
T0=$(date +%s.%N)
# Publishes at a capped rate for long enough; the count actually confirmed is read back below.
FILL_RATE=50000
FILL_SECS=$(( MSGS / FILL_RATE )); [ "$FILL_SECS" -lt 2 ] && FILL_SECS=2
exec 3>"$DATA.peak"
with_peak_rss "$PERF" --uri "$URI" --persistent --confirm 1000 --producers 1 --consumers 0 \
    --queue-pattern backlog --keep-queues --rate "$FILL_RATE" --duration "$FILL_SECS" --json >"$DATA.fill"
exec 3>&-
FILL_PEAK=$(cat "$DATA.peak")
FILLED=$(field confirmed <"$DATA.fill")
T1=$(date +%s.%N)
DISK=$(du -sm "$DATA/messages" | cut -f1)

log "3. SIGKILL and recovery"
kill -9 "$PID"; wait "$PID" 2>/dev/null || true
: >"$LOG"
T2=$(date +%s.%N)
start
T3=$(date +%s.%N)
RECOVERY_LINE=$(grep -a "recovered durable state" "$LOG" | sed 's/\x1b\[[0-9;]*m//g')
RECOVERED=$(echo "$RECOVERY_LINE" | sed -n 's/.*messages=\([0-9]*\).*/\1/p')
RECOVERY_MS=$(echo "$RECOVERY_LINE" | sed -n 's/.* ms=\([0-9]*\).*/\1/p')
AFTER_RECOVERY_RSS=$(rss_mb)

log "4. draining the backlog"
exec 3>"$DATA.peak"
# With no producers, warren-perf consumes for --duration: long enough for the whole backlog.
DRAIN_SECS=$(( FILLED / 40000 + 10 ))
T4=$(date +%s.%N)
with_peak_rss "$PERF" --uri "$URI" --persistent --producers 0 --consumers 1 --prefetch 100 \
    --queue-pattern backlog --duration "$DRAIN_SECS" --json >"$DATA.drain"
exec 3>&-
DRAIN_PEAK=$(cat "$DATA.peak")
DRAINED=$(field consumed <"$DATA.drain")
sleep 2
DISK_AFTER=$(du -sm "$DATA/messages" | cut -f1)

cat <<EOF
# Warren durability benchmark — $(date -u +%Y-%m-%dT%H:%MZ)

- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB RAM
- $VERSION ($(cd "$ROOT" && git describe --always --dirty)), data directory on $(df -T "$DATA" | awk 'NR==2 {print $2}')

| measurement | value |
|---|---|
| durable+persistent 1 KB 1p/1c, confirms (window 100): consumed msg/s (median) | $ON_RATE (missing/dup $ON_LOST) |
| same without confirms: consumed msg/s (median) | $OFF_RATE |
| backlog filled (persistent 1 KB, no consumer) | $FILLED messages, $DISK MB on disk, $(python3 -c "print(round(($T1-$T0),1))") s |
| broker RSS: before filling / peak while filling | $BASE_RSS MB / $FILL_PEAK MB |
| recovery after SIGKILL | $RECOVERED messages in $RECOVERY_MS ms (listening after $(python3 -c "print(round(($T3-$T2),2))") s) |
| RSS after recovery / peak while draining | $AFTER_RECOVERY_RSS MB / $DRAIN_PEAK MB |
| drained with 1 consumer (prefetch 100) | $DRAINED messages; disk after drain $DISK_AFTER MB |
EOF
