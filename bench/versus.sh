#!/usr/bin/env bash
# Before/after benchmark: two Warren binaries on the workloads of bench/compare.sh, interleaved
# in one run, so that both see the same machine load.
#
#   OLD_WARREN=/path/to/old/warren NEW_WARREN=/path/to/new/warren bench/versus.sh
#   DURATION=10 ROUNDS=2 WORKLOADS="a b c d e f g h" ...   # the defaults
#   WORKLOADS="e" ROUNDS=4 ...                               # one workload again, more rounds
#
# For each workload, ROUNDS rounds of (old, new): every run starts its broker fresh on a new
# temporary data directory on 127.0.0.1:${VERSUS_PORT:-5685}, runs warren-perf with the
# workload's arguments from bench/workloads.sh (the ones bench/compare.sh uses) and stops the
# broker (SIGTERM, SIGKILL after 10 s). Only one broker runs at a time. Each binary gets only the
# flags it knows (`--help`): the management and httpmq listeners, where the binary has them,
# listen on 127.0.0.1:0, so no port is shared with anything else on the machine.
# Workloads: the classic rows a-h and m10/m30/m50 (the scale rows need restarts; use
# compare.sh with WARREN_BIN for them).
#
# OLD_LABEL and NEW_LABEL name the binaries in the report (e.g. their commits).
# PERF is the warren-perf used for both (default: the workspace's release build, built if
# missing). IDLE_CONNS etc. as in compare.sh. The table goes to stdout and to
# bench/results/versus-<date>.md; the raw JSON to bench/results/raw-versus-<date>/.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;; "") ;; *) echo "unknown argument: $1" >&2; exit 64 ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/workloads.sh
. "$ROOT/bench/workloads.sh"
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
WORKLOADS=${WORKLOADS:-"a b c d e f g h"}
VERSUS_PORT=${VERSUS_PORT:-5685}
OLD_WARREN=${OLD_WARREN:?set OLD_WARREN to the old warren binary}
NEW_WARREN=${NEW_WARREN:?set NEW_WARREN to the new warren binary}
# A run is a loss when new/old falls below this (throughput rows) or the memory per
# connection grows beyond its inverse (h).
LOSS_RATIO=${LOSS_RATIO:-0.95}
# What the report calls the two binaries (e.g. their commits).
OLD_LABEL=${OLD_LABEL:-old}
NEW_LABEL=${NEW_LABEL:-new}


log() { echo "[versus] $(date +%H:%M:%S) $*" >&2; }

for b in "$OLD_WARREN" "$NEW_WARREN"; do
    [ -x "$b" ] || { echo "not an executable: $b" >&2; exit 1; }
done
for w in $WORKLOADS; do
    [ -n "${ARGS[$w]:-}" ] || { echo "unknown workload: $w" >&2; exit 64; }
    case "${KIND[$w]:-}" in ""|latency) ;; *) echo "workload $w needs restarts; use bench/compare.sh" >&2; exit 64 ;; esac
done
command -v jq >/dev/null || { log "installing jq"; apt-get update -qq && apt-get install -y -qq jq >/dev/null; }

if [ -z "${PERF:-}" ]; then
    PERF="${CARGO_TARGET_DIR:-$ROOT/target}/release/warren-perf"
    if [ ! -x "$PERF" ]; then
        log "building warren-perf (release)"
        (cd "$ROOT" && cargo build --release -p warren-perf) >&2
    fi
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
if port_open "$VERSUS_PORT"; then
    echo "port $VERSUS_PORT is already in use; set VERSUS_PORT to a free port" >&2
    exit 1
fi

STAMP=$(date +%Y-%m-%dT%H%M%S)
WORK=$(mktemp -d /tmp/warren-versus.XXXXXX)
RESULT_MD="$ROOT/bench/results/versus-$STAMP.md"
RAW="$ROOT/bench/results/raw-versus-$STAMP"
mkdir -p "$ROOT/bench/results"
LOAD_LOG="$WORK/load"
BROKER_PID=""
BROKER_DATA=""
LOAD_SAMPLER=""

stop_broker() {
    if [ -n "$BROKER_PID" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill "$BROKER_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$BROKER_PID" 2>/dev/null || true
    fi
    [ -n "$BROKER_PID" ] && { wait "$BROKER_PID" 2>/dev/null || true; }
    BROKER_PID=""
    [ -n "$BROKER_DATA" ] && rm -rf "$BROKER_DATA"
    BROKER_DATA=""
}

cleanup() {
    set +e
    [ -n "$LOAD_SAMPLER" ] && kill "$LOAD_SAMPLER" 2>/dev/null
    stop_broker
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The flags a binary is started with: the AMQP listener and the data directory, plus the
# other listeners on an ephemeral loopback port where the binary has them.
broker_flags() { # binary data-dir
    local help
    help=$("$1" --help 2>&1 || true)
    printf '%s\n' --amqp-listen "127.0.0.1:$VERSUS_PORT" --data-dir "$2" --log-level warn
    case "$help" in *--management-listen*) printf '%s\n' --management-listen 127.0.0.1:0 ;; esac
    case "$help" in *--httpmq-listen*) printf '%s\n' --httpmq-listen 127.0.0.1:0 ;; esac
}

start_broker() { # binary log
    local bin=$1 blog=$2 flags
    for _ in $(seq 100); do port_open "$VERSUS_PORT" || break; sleep 0.1; done
    if port_open "$VERSUS_PORT"; then
        log "port $VERSUS_PORT is taken by something else"
        return 1
    fi
    BROKER_DATA=$(mktemp -d /tmp/warren-versus-data.XXXXXX)
    mapfile -t flags < <(broker_flags "$bin" "$BROKER_DATA")
    echo "$bin ${flags[*]}" >>"$blog"
    "$bin" "${flags[@]}" >>"$blog" 2>&1 &
    BROKER_PID=$!
    for _ in $(seq 600); do
        kill -0 "$BROKER_PID" 2>/dev/null || break
        port_open "$VERSUS_PORT" && return 0
        sleep 0.1
    done
    log "$bin did not start listening on $VERSUS_PORT; log:"
    tail -20 "$blog" >&2
    return 1
}

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# Poll the broker's RSS every 100 ms until the file $2 disappears; write the peak to $3.
sample_rss() {
    local pid=$1 flag=$2 out=$3 peak=0 v
    while [ -e "$flag" ]; do
        v=$(rss_kb "$pid"); v=${v:-0}
        [ "$v" -gt "$peak" ] && peak=$v
        sleep 0.1
    done
    echo "$peak" >"$out"
}

# run_one SIDE BINARY WORKLOAD ROUND -> $WORK/<w>.<side>.<round>.{json,out,rss,base,load}
run_one() {
    local side=$1 bin=$2 w=$3 r=$4 dur=$DURATION
    local out="$WORK/$w.$side.$r" flag="$WORK/sampling" sampler rc=0 line
    : >"$out.out"
    if ! start_broker "$bin" "$WORK/$side.log"; then
        echo '{"errors":["broker failed to start"]}' >"$out.json"
        stop_broker
        return 0
    fi
    sleep 1
    rss_kb "$BROKER_PID" >"$out.base"
    touch "$flag"
    sample_rss "$BROKER_PID" "$flag" "$out.rss" &
    sampler=$!
    [ "$w" = h ] && [ "$dur" -lt 5 ] && dur=5
    cut -d' ' -f1 /proc/loadavg >"$out.load"
    log "($w) round $r, $side: warren-perf ${ARGS[$w]} --duration $dur"
    # shellcheck disable=SC2086
    timeout --kill-after=10 "${PERF_TIMEOUT:-600}" "$PERF" --uri "amqp://guest:guest@127.0.0.1:$VERSUS_PORT/%2f" \
        ${ARGS[$w]} --duration "$dur" --broker-pid "$BROKER_PID" --json >>"$out.out" 2>&1 || rc=$?
    rm -f "$flag"
    wait "$sampler" || true
    line=$(grep '^{' "$out.out" | tail -1 || true)
    [ -n "$line" ] || line=$(jq -cn --arg e "warren-perf exited $rc without a report: $(tail -3 "$out.out" | tr '\n' ' ')" '{errors:[$e]}')
    if ! kill -0 "$BROKER_PID" 2>/dev/null; then
        line=$(jq -c '.errors += ["broker process died during the workload"]' <<<"$line")
        log "the $side broker died during ($w); last log lines:"
        tail -20 "$WORK/$side.log" >&2
    fi
    echo "$line" >"$out.json"
    stop_broker
    log "  -> $(cell_rate "$w" "$side" "$r") $( [ "$w" = h ] && echo KB/conn || echo msg/s), peak RSS $(mb "$(cat "$out.rss")") MB"
}

j() { jq -r "$2 // empty" "$WORK/$1.json" 2>/dev/null || true; }
mb() { awk -v k="$1" 'BEGIN { if (k == "" || k == 0) print "-"; else printf "%.0f", k / 1024 }'; }
median() { # numbers on stdin, one a line; "-" if none
    grep -E '^-?[0-9.]+$' | sort -g | awk '{a[NR] = $1} END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}
# The figure of one run: consumed msg/s (median of per-second rates), or for (h) the broker's
# RSS growth per idle connection in KB.
cell_rate() { # workload side round
    local k="$1.$2.$3"
    [ -e "$WORK/$k.json" ] || { echo "-"; return; }
    if [ "$1" = h ]; then
        local opened
        opened=$(j "$k" .idle_connections_opened)
        [ "${opened:-0}" = "$IDLE_CONNS" ] || { echo "FAIL"; return; }
        awk -v b="$(cat "$WORK/$k.base")" -v p="$(cat "$WORK/$k.rss")" -v n="$IDLE_CONNS" 'BEGIN { printf "%.1f\n", (p - b) / n }'
        return
    fi
    local r
    r=$(j "$k" .consume_rate_median)
    if [ -n "$r" ]; then printf "%.0f\n" "$r"; else echo "FAIL"; fi
}
rounds_of() { # workload side -> "r1 / r2 / ..."
    local r s=""
    for r in $(seq "$ROUNDS"); do s="$s${s:+ / }$(cell_rate "$1" "$2" "$r")"; done
    echo "$s"
}
median_of() { # workload side field-command
    local r
    for r in $(seq "$ROUNDS"); do "$3" "$1" "$2" "$r"; done | median
}
rss_of() { local k="$1.$2.$3"; [ -e "$WORK/$k.rss" ] && awk '{ printf "%.1f\n", $1 / 1024 }' "$WORK/$k.rss"; return 0; }
# Broker CPU per consumed message over the measured window, µs: less sensitive to the machine's
# load than msg/s (CPU time taken from the broker by a busy hypervisor still counts).
cpu_of() { [ "$1" = h ] || jq -r 'if (.consume_rate_avg // 0) > 0 and .cpu.window_s then .cpu.broker_cpu_s * 1e6 / (.consume_rate_avg * .cpu.window_s) else empty end' "$WORK/$1.$2.$3.json" 2>/dev/null || true; }
p99_of() { [ "$1" = h ] || j "$1.$2.$3" .latency_p99_us; }
p50_of() { [ "$1" = h ] || j "$1.$2.$3" .latency_p50_us; }
lost_of() { # workload side -> "missing/duplicates" summed over rounds, and errors
    local r m=0 d=0 e=0 k
    for r in $(seq "$ROUNDS"); do
        k="$1.$2.$r"
        m=$((m + $(j "$k" .missing | grep -E '^[0-9]+$' || echo 0)))
        d=$((d + $(j "$k" .duplicates | grep -E '^[0-9]+$' || echo 0)))
        e=$((e + $(jq -r '(.errors // []) | length' "$WORK/$k.json" 2>/dev/null || echo 1)))
    done
    local s="$m/$d"
    [ "$1" = h ] && s="-"
    [ "$e" != 0 ] && s="$s, $e errors"
    echo "$s"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }
fmt() { awk -v a="$1" -v f="${2:-%.0f}" 'BEGIN { if (a ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) printf f, a; else print "-" }'; }
verdict() { # workload ratio(new/old)
    awk -v w="$1" -v q="$2" -v t="$LOSS_RATIO" 'BEGIN {
        if (q !~ /^[0-9.]+$/) { print "-"; exit }
        if (w == "h") { if (q > 1 / t) printf "new takes %.0f%% more memory\n", (q - 1) * 100; else print "ok" }
        else if (q < t) printf "new %.0f%% slower\n", (1 - q) * 100; else print "ok" }'
}

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
( while :; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 5; done ) >"$LOAD_LOG" 2>/dev/null &
LOAD_SAMPLER=$!

# (h) first, as in compare.sh (here every run has a fresh broker anyway).
RUN_ORDER=""
case " $WORKLOADS " in *" h "*) RUN_ORDER="h" ;; esac
for w in $WORKLOADS; do [ "$w" = h ] || RUN_ORDER="$RUN_ORDER $w"; done
for w in $RUN_ORDER; do
    for r in $(seq "$ROUNDS"); do
        run_one old "$OLD_WARREN" "$w" "$r"
        run_one new "$NEW_WARREN" "$w" "$r"
    done
done
kill "$LOAD_SAMPLER" 2>/dev/null || true
LOAD_SAMPLER=""

version_of() { "$1" --version 2>/dev/null | head -1 || echo "?"; }
load_stats() { # field of the load log (2 = 1 min)
    awk -v f="$1" '{print $f}' "$LOAD_LOG" | sort -g | awk '{a[NR] = $1} END { if (NR) printf "min %s, median %s, max %s", a[1], a[int((NR + 1) / 2)], a[NR]; else print "-" }'
}
{
    echo "# Warren old vs new — $STAMP"
    echo
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM"
    echo "- load average during the run (1 min, sampled every 5 s): $(load_stats 2)"
    echo "- old: $OLD_LABEL ($(version_of "$OLD_WARREN")), new: $NEW_LABEL ($(version_of "$NEW_WARREN")); one warren-perf for both"
    echo "- rounds per workload: $ROUNDS, each round old then new, each run on a freshly started broker with an empty data directory; ${DURATION} s per run, 1 KB messages unless noted"
    echo "- msg/s = median of the per-second consumed rate of one run; for (h) the cells are the broker's RSS growth per idle connection in KB (lower is better, so new/old above 1 is a loss)"
    echo "- broker CPU = the broker's CPU time over the measured window / messages consumed in it, µs, median over the rounds (less sensitive to the machine's load than msg/s)"
    echo "- RSS = peak broker VmRSS during the run, MB, median over the rounds; p50/p99 = end-to-end latency in µs, median over the rounds; missing/dup summed over the rounds"
    echo
    echo "| workload | old msg/s (per round) | new msg/s (per round) | median old | median new | new/old | verdict | broker CPU µs/msg old / new | RSS MB old / new | p50 µs old / new | p99 µs old / new | missing/dup old / new |"
    echo "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"
    for w in $WORKLOADS; do
        mo=$(median_of "$w" old cell_rate); mn=$(median_of "$w" new cell_rate)
        q=$(ratio "$mn" "$mo")
        d=${DESC[$w]}; case "$d" in "("*) ;; *) d="($w) $d" ;; esac
        fm=%.0f; [ "$w" = h ] && fm=%.1f
        echo "| $d | $(rounds_of "$w" old) | $(rounds_of "$w" new) | $(fmt "$mo" "$fm") | $(fmt "$mn" "$fm") | $q | $(verdict "$w" "$q") | $(fmt "$(median_of "$w" old cpu_of)" %.2f) / $(fmt "$(median_of "$w" new cpu_of)" %.2f) | $(fmt "$(median_of "$w" old rss_of)") / $(fmt "$(median_of "$w" new rss_of)") | $(fmt "$(median_of "$w" old p50_of)") / $(fmt "$(median_of "$w" new p50_of)") | $(fmt "$(median_of "$w" old p99_of)") / $(fmt "$(median_of "$w" new p99_of)") | $(lost_of "$w" old) / $(lost_of "$w" new) |"
    done
    errs=""
    for f in "$WORK"/*.json; do
        e=$(jq -r '(.errors // [])[]' "$f" 2>/dev/null | head -3)
        [ -n "$e" ] && errs="$errs"$'\n'"- $(basename "$f" .json): $(echo "$e" | tr '\n' ';' | sed 's/;$//')"
    done
    if [ -n "$errs" ]; then
        echo
        echo "Errors reported:$errs"
    fi
    echo
    echo "Commands: \`warren-perf --uri URI <args> --duration $DURATION --broker-pid PID --json\` with:"
    echo
    for w in $WORKLOADS; do echo "- ($w) \`${ARGS[$w]}\`"; done
} >"$RESULT_MD"

cat "$RESULT_MD"
mkdir -p "$RAW"
for f in "$WORK"/*.json "$WORK"/*.load "$WORK"/*.rss "$WORK"/*.base; do [ -e "$f" ] && cp "$f" "$RAW/"; done
log "results written to $RESULT_MD (raw output in $RAW)"
