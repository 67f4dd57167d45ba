#!/usr/bin/env bash
# Soak test: starts a warren broker (durable data in a temporary directory), runs the
# warren-soak driver against it (crates/warren-perf/src/bin/warren-soak: many connections
# publishing with confirms and consuming, random TCP-level disconnects, basic.get, nacks and
# rejects, TTLs and dead-lettering, length limits, queue churn), samples the broker's RSS and
# open file descriptors every second, and checks the end state:
#
#   * the driver's exactly-once check passed (every confirmed message consumed, none twice,
#     redelivered flags right, no refused publish delivered, every queue drained, every
#     churned queue gone);
#   * the broker's RSS came back to within RSS_SLACK_MB of its baseline (taken after a short
#     warm-up run, so that the allocator's and the runtime's one-off growth is not counted);
#   * the broker holds no more file descriptors than at the baseline;
#   * the broker logged no panic and stops cleanly on SIGTERM.
#
#   bench/soak.sh                               # 30 minutes, release build
#   SOAK_SECONDS=60 PROFILE=debug bench/soak.sh # the short mode CI runs
#
# Environment: SOAK_SECONDS (default 1800), PROFILE (release | debug, default release),
# PORT (default 5675), RSS_SLACK_MB (default 64), SOAK_ARGS (extra warren-soak flags, e.g.
# "--publishers 8 --rate 500"; see `warren-soak --help`), DATA_ROOT (default /tmp),
# SOAK_LOG_DIR (where the broker log and samples are kept; default a temporary directory).
# Exit status 0 when every check passed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SOAK_SECONDS=${SOAK_SECONDS:-1800}
PROFILE=${PROFILE:-release}
PORT=${PORT:-5675}
SOAK_ARGS=${SOAK_ARGS:-}
LOG_LEVEL=${LOG_LEVEL:-warn}
RSS_SLACK_MB=${RSS_SLACK_MB:-64}
DATA_ROOT=${DATA_ROOT:-/tmp}
DATA=$(mktemp -d "$DATA_ROOT/warren-soak.XXXXXX")
LOGS=${SOAK_LOG_DIR:-$DATA.logs}
mkdir -p "$LOGS"
LOG=$LOGS/warren.log
SAMPLES=$LOGS/samples.csv
PID=""

cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
    rm -rf "$DATA"
}
trap cleanup EXIT

say() { echo "[soak] $*" >&2; }

case "$PROFILE" in
    release) BUILD_FLAGS=(--release) ;;
    debug) BUILD_FLAGS=() ;;
    *) say "PROFILE must be release or debug"; exit 2 ;;
esac
say "building ($PROFILE)"
(cd "$ROOT" && cargo build -q "${BUILD_FLAGS[@]}" -p warren-server --bin warren -p warren-perf --bin warren-soak)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WARREN="$TARGET_DIR/$PROFILE/warren"
SOAK="$TARGET_DIR/$PROFILE/warren-soak"

"$WARREN" --amqp-listen "127.0.0.1:$PORT" --management-listen 127.0.0.1:0 --httpmq-listen 127.0.0.1:0 --data-dir "$DATA/data" --log-level "$LOG_LEVEL" >"$LOG" 2>&1 &
PID=$!
for _ in $(seq 300); do
    (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    kill -0 "$PID" 2>/dev/null || { say "warren exited"; cat "$LOG"; exit 1; }
    sleep 0.1
done

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$PID/status"; }
fds() { ls "/proc/$PID/fd" | wc -l; }
mb() { echo $(( $1 / 1024 )); }

# Warm-up: a few seconds of the same load, so that the baseline includes what any run
# allocates once (thread stacks, the runtime's pools, the store's first segment).
say "warm-up"
"$SOAK" --broker "127.0.0.1:$PORT" --duration 5 --seed 1 >"$LOGS/warmup.json" 2>"$LOGS/warmup.err" || {
    say "warm-up run failed:"; cat "$LOGS/warmup.json" "$LOGS/warmup.err" >&2; exit 1; }
# Settle: wait until connections are gone and the descriptor count is stable.
prev=-1
for _ in $(seq 30); do
    sleep 1
    now=$(fds)
    [ "$now" -eq "$prev" ] && break
    prev=$now
done
RSS_BASE=$(rss_kb)
FDS_BASE=$(fds)
say "baseline: RSS $(mb "$RSS_BASE") MB, $FDS_BASE fds"

say "soaking for $SOAK_SECONDS s"
# shellcheck disable=SC2086
"$SOAK" --broker "127.0.0.1:$PORT" --duration "$SOAK_SECONDS" $SOAK_ARGS \
    >"$LOGS/soak.json" 2> >(tee "$LOGS/soak.err" >&2) &
DRIVER=$!
RSS_PEAK=$RSS_BASE
FDS_PEAK=$FDS_BASE
T0=$SECONDS
echo "seconds,rss_kb,fds" >"$SAMPLES"
while kill -0 "$DRIVER" 2>/dev/null; do
    r=$(rss_kb); f=$(fds)
    [ "$r" -gt "$RSS_PEAK" ] && RSS_PEAK=$r
    [ "$f" -gt "$FDS_PEAK" ] && FDS_PEAK=$f
    echo "$((SECONDS - T0)),$r,$f" >>"$SAMPLES"
    sleep 1
done
DRIVER_RC=0
wait "$DRIVER" || DRIVER_RC=$?

# The broker frees what the run left (closed connections, deleted queues, settled segments)
# within a few seconds: wait for the descriptors to come back, then read the memory.
for _ in $(seq 30); do
    [ "$(fds)" -le "$FDS_BASE" ] && break
    sleep 1
done
sleep 2
RSS_END=$(rss_kb)
FDS_END=$(fds)

FAIL=0
SUMMARY=$(tail -n 1 "$LOGS/soak.json")
if [ "$DRIVER_RC" -ne 0 ]; then
    say "FAIL: the driver's checks failed (exit $DRIVER_RC)"
    FAIL=1
fi
if [ "$FDS_END" -gt "$FDS_BASE" ]; then
    say "FAIL: $FDS_END fds at the end, $FDS_BASE at the baseline"
    ls -l "/proc/$PID/fd" >&2 || true
    FAIL=1
fi
if [ "$RSS_END" -gt $((RSS_BASE + RSS_SLACK_MB * 1024)) ]; then
    say "FAIL: RSS $(mb "$RSS_END") MB at the end, baseline $(mb "$RSS_BASE") MB + slack $RSS_SLACK_MB MB"
    FAIL=1
fi
if grep -q "panicked" "$LOG"; then
    say "FAIL: the broker panicked:"
    grep -m 5 -A 5 "panicked" "$LOG" >&2
    FAIL=1
fi
kill -TERM "$PID"
for _ in $(seq 200); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$PID" 2>/dev/null; then
    say "FAIL: the broker did not stop within 20 s of SIGTERM"
    FAIL=1
else
    wait "$PID" || { say "FAIL: the broker exited with status $? on SIGTERM"; FAIL=1; }
fi
PID=""

python3 - "$SUMMARY" "$RSS_BASE" "$RSS_PEAK" "$RSS_END" "$FDS_BASE" "$FDS_PEAK" "$FDS_END" <<'EOF' >&2
import json, sys
s = json.loads(sys.argv[1]) if sys.argv[1].strip() else {}
rss = [int(x) // 1024 for x in sys.argv[2:5]]
fds = sys.argv[5:8]
g = lambda k: s.get(k, "?")
print(f"[soak] load {g('seconds'):.0f} s, drain {g('drain_seconds'):.1f} s" if s else "[soak] no summary from the driver")
print(f"[soak] messages: published {g('published')}, confirmed {g('confirmed')}, nacked {g('nacked')}, "
      f"unconfirmed {g('unconfirmed')} (arrived anyway {g('unconfirmed_arrived')})")
print(f"[soak] deliveries {g('deliveries')} (acked {g('acked_deliveries')}, requeued {g('requeued')}, "
      f"rejected to DLX {g('rejected')}), basic.get {g('gets')} (+{g('get_empty')} empty)")
print(f"[soak] connections {g('connections')}: clean closes {g('clean_closes')} (failed {g('failed_closes')}), disconnects {g('disconnects')}; "
      f"churned queues {g('churn_queues')}")
print(f"[soak] lost {g('lost')}, duplicates {g('duplicates')}, redelivered after a drop {g('redelivered_after_drop')}, "
      f"flag violations {g('flag_violations')}, refused-but-delivered {g('nacked_delivered')}, "
      f"confirm timeouts {g('confirm_timeouts')}")
print(f"[soak] broker RSS baseline/peak/end {rss[0]}/{rss[1]}/{rss[2]} MB; fds baseline/peak/end {'/'.join(fds)}")
for e in s.get("examples", []) + s.get("closed_by_broker", []) + s.get("errors", []):
    print(f"[soak]   {e}")
EOF
say "logs and samples in $LOGS"
if [ "$FAIL" -ne 0 ]; then
    exit 1
fi
say "PASS"
