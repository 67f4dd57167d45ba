#!/usr/bin/env bash
# Compaction benchmark for Warren alone: TARGET_GB (default 10) GB of persistent messages
# published and consumed through one durable queue whose first message stays unacknowledged
# all along (a consumer with prefetch 1 that never acks it). Without compaction that one
# message would keep every segment written after it; with it, disk use follows what is live.
#
#   bench/compaction.sh                     # 10 GB of 16 KB messages
#   TARGET_GB=1 bench/compaction.sh         # quicker
#   SIZE=1024 TARGET_GB=2 bench/compaction.sh
#
# Reports the message store's disk use (sampled every second: peak and at the end), the
# rates, how many compactions ran, and what a SIGKILL and restart bring back (the held
# message, redelivered, and nothing else). Needs python3 with pika.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_GB=${TARGET_GB:-10}
SIZE=${SIZE:-16384}
ROUND=${ROUND:-30}
PORT=${PORT:-5675}
DATA_ROOT=${DATA_ROOT:-/tmp}
DATA=$(mktemp -d "$DATA_ROOT/warren-compaction.XXXXXX")
LOG=$DATA.log
URI="amqp://guest:guest@127.0.0.1:$PORT/%2f"
WARREN="$ROOT/target/release/warren"
PERF="$ROOT/target/release/warren-perf"
PID=""
HOLDER=""
SAMPLER=""

cleanup() {
    [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
    [ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null || true
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
    rm -rf "$DATA" "$DATA".*
}
trap cleanup EXIT

log() { echo "[compaction] $*" >&2; }

start() {
    "$WARREN" --amqp-listen "127.0.0.1:$PORT" --management-listen 127.0.0.1:0 --httpmq-listen 127.0.0.1:0 --data-dir "$DATA" --log-level info >>"$LOG" 2>&1 &
    PID=$!
    for _ in $(seq 600); do
        (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && return 0
        sleep 0.1
    done
    log "warren did not start"; cat "$LOG"; exit 1
}

store_mb() { du -sm "$DATA/messages" 2>/dev/null | cut -f1; }
rss_mb() { awk '/VmRSS/ {printf "%d", $2/1024}' "/proc/$PID/status"; }
field() { python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(d['$1'])"; }

log "building (release)"
(cd "$ROOT" && cargo build --release -q -p warren-server -p warren-perf)
start
VERSION=$("$WARREN" --version)

# Publish the first message and hold it: a consumer with prefetch 1 that never acks.
cat >"$DATA.holder.py" <<'EOF'
import pika, sys, time
conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = conn.channel()
ch.queue_declare("pinned", durable=True)
ch.confirm_delivery()
ch.basic_publish("", "pinned", b"held", pika.BasicProperties(delivery_mode=2))
ch.basic_qos(prefetch_count=1)
def held(c, method, props, body):
    print("holding", body.decode(), method.delivery_tag, flush=True)
ch.basic_consume("pinned", held)
while True:
    conn.process_data_events(time_limit=1)
EOF
python3 "$DATA.holder.py" "$PORT" >"$DATA.holder" 2>&1 &
HOLDER=$!
for _ in $(seq 100); do grep -q holding "$DATA.holder" && break; sleep 0.1; done
grep -q holding "$DATA.holder" || { log "the holder did not get the message"; cat "$DATA.holder"; exit 1; }

# Disk use of the message store, every second.
( while kill -0 "$PID" 2>/dev/null; do echo "$(date +%s) $(store_mb)"; sleep 1; done ) >"$DATA.du" &
SAMPLER=$!

TARGET_BYTES=$((TARGET_GB * 1024 * 1024 * 1024))
PUBLISHED=0
ROUNDS=0
RATES=""
T0=$(date +%s.%N)
BASE_RSS=$(rss_mb)
PEAK_RSS=$BASE_RSS
while [ "$PUBLISHED" -lt "$TARGET_BYTES" ]; do
    OUT=$("$PERF" --uri "$URI" --persistent --confirm 100 --prefetch 100 --producers 1 \
        --consumers 1 --size "$SIZE" --queue-pattern pinned --keep-queues \
        --duration "$ROUND" --json)
    N=$(echo "$OUT" | field confirmed)
    MISSING=$(echo "$OUT" | field missing)/$(echo "$OUT" | field duplicates)
    PUBLISHED=$((PUBLISHED + N * SIZE))
    ROUNDS=$((ROUNDS + 1))
    RATES="$RATES $(echo "$OUT" | field consume_rate_median)"
    R=$(rss_mb); [ "$R" -gt "$PEAK_RSS" ] && PEAK_RSS=$R
    log "round $ROUNDS: $N messages (missing/dup $MISSING), $((PUBLISHED / 1024 / 1024)) MB so far, store $(store_mb) MB"
done
T1=$(date +%s.%N)
# Let the last segments settle and be compacted.
sleep 10
FINAL=$(store_mb)
kill "$SAMPLER" 2>/dev/null || true; SAMPLER=""
PEAK=$(awk 'BEGIN {m=0} {if ($2>m) m=$2} END {print m}' "$DATA.du")
COMPACTIONS=$(grep -ac "compacted segment" "$LOG" || true)
grep -q holding "$DATA.holder" && HELD=yes || HELD=no

log "SIGKILL and restart"
kill -9 "$PID"; wait "$PID" 2>/dev/null || true
kill "$HOLDER" 2>/dev/null || true; HOLDER=""
start
AFTER=$(python3 - "$PORT" <<'EOF'
import pika, sys
ch = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1]))).channel()
out = []
while True:
    m, p, b = ch.basic_get("pinned", auto_ack=True)
    if m is None:
        break
    out.append(f"{b[:8]!r} redelivered={m.redelivered}")
print(len(out), "; ".join(out[:3]))
EOF
)

cat <<EOF
# Warren compaction benchmark — $(date -u +%Y-%m-%dT%H:%MZ)

- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(free -g | awk '/Mem:/ {print $2}') GiB RAM
- $VERSION ($(cd "$ROOT" && git describe --always --dirty)), data directory on $(df -T "$DATA" | awk 'NR==2 {print $2}'), default settings (64 MiB segments, compaction_ratio 0.5, compaction_quiet_ms 2000)

| measurement | value |
|---|---|
| published and consumed (persistent, confirms 100, prefetch 100, $SIZE B messages) | $((PUBLISHED / 1024 / 1024)) MB in $(python3 -c "print(round(($T1-$T0),1))") s, $ROUNDS rounds of ${ROUND} s; median consume rates (msg/s):$RATES |
| first message held unacknowledged throughout | $HELD |
| message store on disk: peak / 10 s after the end | $PEAK MB / $FINAL MB |
| compactions logged | $COMPACTIONS |
| broker RSS: before / peak at round ends | $BASE_RSS MB / $PEAK_RSS MB |
| after SIGKILL and restart, the queue holds | $AFTER |
EOF
