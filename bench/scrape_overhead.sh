#!/usr/bin/env bash
# What a Prometheus scrape every second costs workload (a) of bench/compare.sh (warren-perf
# 1 producer / 1 consumer, transient, manual ack, prefetch 100): runs (a) alternately without
# scraping (A) and with `curl /metrics` and `curl /metrics/per-object` once a second (B), on
# one release-built broker, and prints each run's consumed rate (warren-perf's
# consume_rate_median), the medians of A and B and the cost, (A - B) / A.
#
#   bench/scrape_overhead.sh                  # 5 pairs of 10 s runs
#   PAIRS=8 DURATION=15 bench/scrape_overhead.sh
#
# Needs curl and jq (installed with apt-get when missing). Set NO_BUILD=1 to use the
# binaries already in target/release.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PAIRS=${PAIRS:-5}
DURATION=${DURATION:-10}
AMQP_PORT=${AMQP_PORT:-5699}
MGMT_PORT=${MGMT_PORT:-15699}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

log() { echo "[scrape_overhead] $*" >&2; }
for tool in curl jq; do
    command -v "$tool" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$tool" >/dev/null; }
done
if [ -z "${NO_BUILD:-}" ]; then
    log "building warren-server and warren-perf (release)"
    (cd "$ROOT" && cargo build --release -p warren-server -p warren-perf) >&2
fi
WARREN="$TARGET_DIR/release/warren"
PERF="$TARGET_DIR/release/warren-perf"

WORK=$(mktemp -d /tmp/warren-scrape.XXXXXX)
"$WARREN" --amqp-listen "127.0.0.1:$AMQP_PORT" --management-listen "127.0.0.1:$MGMT_PORT" \
    --httpmq-listen 127.0.0.1:0 --data-dir "$WORK/data" --log-level warn >"$WORK/warren.log" 2>&1 &
BROKER=$!
SCRAPER=
cleanup() {
    [ -n "$SCRAPER" ] && kill "$SCRAPER" 2>/dev/null || true
    kill "$BROKER" 2>/dev/null || true
    wait "$BROKER" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$MGMT_PORT/metrics" >/dev/null 2>&1 && break
    sleep 0.1
done

scrape_loop() { # both endpoints once a second, as a Prometheus server with two jobs would
    while :; do
        curl -sf "http://127.0.0.1:$MGMT_PORT/metrics" >/dev/null || true
        curl -sf "http://127.0.0.1:$MGMT_PORT/metrics/per-object" >/dev/null || true
        sleep 1
    done
}

run() { # run MODE -> prints the consumed rate
    local mode=$1 out="$WORK/run.json"
    if [ "$mode" = B ]; then
        scrape_loop &
        SCRAPER=$!
    fi
    "$PERF" --uri "amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f" --producers 1 --consumers 1 \
        --prefetch 100 --duration "$DURATION" --broker-pid "$BROKER" --json >"$out" 2>/dev/null || true
    if [ -n "$SCRAPER" ]; then
        kill "$SCRAPER" 2>/dev/null || true
        wait "$SCRAPER" 2>/dev/null || true
        SCRAPER=
    fi
    jq -r '.consume_rate_median // "FAIL"' "$out"
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

A=() B=()
for i in $(seq "$PAIRS"); do
    a=$(run A); b=$(run B)
    log "pair $i: A (no scrape) $a msg/s, B (scrape every 1 s) $b msg/s"
    A+=("$a"); B+=("$b")
done
ma=$(printf '%s\n' "${A[@]}" | grep -v FAIL | median)
mb=$(printf '%s\n' "${B[@]}" | grep -v FAIL | median)
echo "A (no scrape):          ${A[*]}  median $ma msg/s"
echo "B (scrape every 1 s):   ${B[*]}  median $mb msg/s"
awk -v a="$ma" -v b="$mb" 'BEGIN { printf "cost of scraping: %.1f %% of workload (a)\n", (a - b) * 100 / a }'
# The scrape's own price, free of the run-to-run noise: the broker's CPU time (utime +
# stime, clock ticks) over 200 back-to-back scrapes of both endpoints on the idle broker.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$BROKER/stat"; }
before=$(cpu_ticks)
for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:$MGMT_PORT/metrics" >/dev/null
    curl -sf "http://127.0.0.1:$MGMT_PORT/metrics/per-object" >/dev/null
done
after=$(cpu_ticks)
awk -v t="$((after - before))" -v hz="$(getconf CLK_TCK)" 'BEGIN {
    ms = t * 1000 / hz / 200
    printf "broker CPU per scrape of both endpoints: %.2f ms (%.2f %% of one core at one scrape a second)\n", ms, ms / 10 }'
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
