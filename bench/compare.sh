#!/usr/bin/env bash
# Side-by-side benchmark: Warren vs RabbitMQ, same workloads, same run.
#
#   bench/compare.sh                 # both brokers, DURATION=10 s per workload
#   DURATION=5 bench/compare.sh      # shorter
#   bench/compare.sh --only warren   # skip RabbitMQ
#   bench/compare.sh --only rabbitmq # skip Warren
#   WORKLOADS="a b g" bench/compare.sh
#
# Warren is started on 127.0.0.1:${WARREN_PORT:-5673} with a temporary data
# directory and stopped at the end. RabbitMQ is used on 127.0.0.1:5672; it is
# installed from Debian's rabbitmq-server package if missing, started if not
# running, and stopped again at the end if this script started it.
# Results go to stdout and bench/results/<date>.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10}
WARREN_PORT=${WARREN_PORT:-5673}
RABBIT_PORT=5672
WORKLOADS=${WORKLOADS:-"a b c d e f g h"}
IDLE_CONNS=${IDLE_CONNS:-1000}
ONLY=""

while [ $# -gt 0 ]; do
    case "$1" in
        --only) ONLY=${2:?--only needs warren or rabbitmq}; shift 2 ;;
        --only=*) ONLY=${1#--only=}; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 64 ;;
    esac
done
case "$ONLY" in ""|warren|rabbitmq) ;; *) echo "--only takes warren or rabbitmq" >&2; exit 64 ;; esac
BROKERS="warren rabbitmq"
[ -n "$ONLY" ] && BROKERS=$ONLY
want() { case " $BROKERS " in *" $1 "*) return 0 ;; esac; return 1; }

log() { echo "[compare] $*" >&2; }

STAMP=$(date +%Y-%m-%dT%H%M%S)
WARREN_REV=$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)
WORK=$(mktemp -d /tmp/warren-bench.XXXXXX)
mkdir -p "$ROOT/bench/results"
RESULT_MD="$ROOT/bench/results/$STAMP.md"

WARREN_PID=""
WARREN_DATA=""
STARTED_RABBIT=0

stop_warren() {
    if [ -n "$WARREN_PID" ] && kill -0 "$WARREN_PID" 2>/dev/null; then
        kill "$WARREN_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$WARREN_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$WARREN_PID" 2>/dev/null || true
    fi
    WARREN_PID=""
    [ -n "$WARREN_DATA" ] && rm -rf "$WARREN_DATA"
    WARREN_DATA=""
}

stop_rabbit() {
    if [ "$STARTED_RABBIT" = 1 ]; then
        log "stopping RabbitMQ (started by this script)"
        rabbitmqctl stop >/dev/null 2>&1 || true
        for _ in $(seq 100); do pgrep -x beam.smp >/dev/null || break; sleep 0.2; done
        epmd -kill >/dev/null 2>&1 || true
        STARTED_RABBIT=0
    fi
}

# The broker not under test is paused (SIGSTOP) while the other one runs a workload, and
# resumed (SIGCONT) afterwards: on a 2-core machine an idle Erlang VM still spins its
# schedulers and would take CPU from the broker being measured (an idle Warren takes none,
# but is paused all the same, for symmetry).
# Stopping a process of this script's process group while the group is (or becomes) orphaned,
# e.g. when the script runs detached from the shell that started it, makes the kernel send the
# group SIGHUP; ignore it (children inherit the disposition).
trap '' HUP

broker_pids() {
    case "$1" in
        warren) [ -n "$WARREN_PID" ] && echo "$WARREN_PID" ;;
        rabbitmq) pgrep -x beam.smp || true; pgrep -x erl_child_setup || true ;;
    esac
}
pause_others() {
    local o p
    for o in $BROKERS; do
        [ "$o" = "$1" ] && continue
        for p in $(broker_pids "$o"); do kill -STOP "$p" 2>/dev/null || true; done
    done
}
resume_all() {
    local o p
    for o in $BROKERS; do
        for p in $(broker_pids "$o"); do kill -CONT "$p" 2>/dev/null || true; done
    done
}

cleanup() {
    resume_all
    stop_warren
    stop_rabbit
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
    local port=$1 secs=$2
    for _ in $(seq $((secs * 10))); do
        port_open "$port" && return 0
        sleep 0.1
    done
    return 1
}

command -v jq >/dev/null || { log "installing jq"; apt-get update -qq && apt-get install -y -qq jq >/dev/null; }

# ---- build ---------------------------------------------------------------
log "building warren-server and warren-perf (release)"
(cd "$ROOT" && cargo build --release -p warren-server -p warren-perf) >&2
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PERF="$TARGET_DIR/release/warren-perf"
WARREN="$TARGET_DIR/release/warren"

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- brokers -------------------------------------------------------------
start_warren() {
    WARREN_DATA=$(mktemp -d /tmp/warren-bench-data.XXXXXX)
    "$WARREN" --amqp-listen "127.0.0.1:$WARREN_PORT" --data-dir "$WARREN_DATA" \
        --log-level warn >>"$WORK/warren.log" 2>&1 &
    WARREN_PID=$!
    if ! wait_port "$WARREN_PORT" 30; then
        log "Warren did not start listening on $WARREN_PORT; log:"
        tail -20 "$WORK/warren.log" >&2
        return 1
    fi
}

start_rabbit() {
    if ! command -v rabbitmq-server >/dev/null; then
        log "installing rabbitmq-server from Debian"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
        # the package may start it through the init system; stop that so we control it
        rabbitmqctl stop >/dev/null 2>&1 || true
    fi
    if port_open "$RABBIT_PORT"; then
        log "RabbitMQ already running on $RABBIT_PORT"
        return 0
    fi
    log "starting RabbitMQ on 127.0.0.1:$RABBIT_PORT"
    # Debian's /usr/sbin/rabbitmq-server switches user through su, whose PAM
    # limits cut the open-file limit to 1024 (~830 AMQP connections). Drop
    # privileges with setpriv instead so the raised limit above is kept.
    local cmd=(rabbitmq-server)
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id rabbitmq >/dev/null 2>&1 \
        && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
        cmd=(setpriv --reuid rabbitmq --regid rabbitmq --init-groups
            env HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
    fi
    (cd /var/lib/rabbitmq 2>/dev/null || cd /tmp
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$RABBIT_PORT \
            exec setsid "${cmd[@]}" >>"$WORK/rabbitmq.log" 2>&1 </dev/null) &
    STARTED_RABBIT=1
    if ! wait_port "$RABBIT_PORT" 120; then
        log "RabbitMQ did not start; log:"
        tail -30 "$WORK/rabbitmq.log" >&2
        return 1
    fi
    rabbitmqctl await_startup >/dev/null 2>&1 || true
}

# RSS (kB) of a broker: Warren's process, or the sum of RabbitMQ's beam.smp.
broker_pids() {
    case "$1" in
        warren) echo "$WARREN_PID" ;;
        rabbitmq) pgrep -x beam.smp | tr '\n' ' ' ;;
    esac
}
rss_kb() {
    local total=0 pid v
    for pid in $(broker_pids "$1"); do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
        total=$((total + ${v:-0}))
    done
    echo "$total"
}

# Poll RSS every 100 ms until the file $2 disappears; write the peak to $3.
sample_rss() {
    local broker=$1 flag=$2 out=$3 peak=0 v
    while [ -e "$flag" ]; do
        v=$(rss_kb "$broker")
        [ "$v" -gt "$peak" ] && peak=$v
        sleep 0.1
    done
    echo "$peak" >"$out"
}

# ---- workloads -----------------------------------------------------------
declare -A DESC ARGS
DESC[a]="1p/1c transient, manual ack, prefetch 100"
ARGS[a]="--producers 1 --consumers 1 --prefetch 100"
DESC[b]="1p/1c durable+persistent+confirms(100)"
ARGS[b]="--producers 1 --consumers 1 --prefetch 100 --persistent --confirm 100"
DESC[c]="4p/4c durable+persistent+confirms(100)"
ARGS[c]="--producers 4 --consumers 4 --prefetch 100 --persistent --confirm 100"
DESC[d]="64 KB 1p/1c durable+persistent+confirms(100)"
ARGS[d]="--producers 1 --consumers 1 --prefetch 100 --persistent --confirm 100 --size 65536"
DESC[e]="16 queues x 1p/1c transient"
ARGS[e]="--queues 16 --producers 16 --consumers 16 --prefetch 100"
DESC[f]="fanout 1p to 4 queues/4c transient"
ARGS[f]="--exchange-type fanout --queues 4 --producers 1 --consumers 4 --prefetch 100"
DESC[g]="fixed rate 10k msg/s 1p/1c transient (latency)"
ARGS[g]="--producers 1 --consumers 1 --prefetch 100 --rate 10000"
DESC[h]="$IDLE_CONNS idle connections (memory/conn)"
ARGS[h]="--idle-connections $IDLE_CONNS"

uri_of() {
    case "$1" in
        warren) echo "amqp://guest:guest@127.0.0.1:$WARREN_PORT/%2f" ;;
        rabbitmq) echo "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2f" ;;
    esac
}

ensure_broker() {
    case "$1" in
        warren)
            if [ -z "$WARREN_PID" ] || ! kill -0 "$WARREN_PID" 2>/dev/null; then
                [ -n "$WARREN_PID" ] && log "Warren is not running any more; restarting it"
                WARREN_PID=""
                start_warren
            fi ;;
        rabbitmq) port_open "$RABBIT_PORT" || start_rabbit ;;
    esac
}

# run_one BROKER WORKLOAD -> writes $WORK/<w>.<broker>.{json,out,rss,base}
run_one() {
    local broker=$1 w=$2 base flag dur
    local out="$WORK/$w.$broker"
    ensure_broker "$broker" || { echo '{"errors":["broker failed to start"]}' >"$out.json"; return; }
    sleep 1
    base=$(rss_kb "$broker")
    echo "$base" >"$out.base"
    flag="$WORK/sampling.$w.$broker"
    touch "$flag"
    sample_rss "$broker" "$flag" "$out.rss" &
    local sampler=$!
    dur=$DURATION
    [ "$w" = h ] && [ "$dur" -lt 5 ] && dur=5
    log "workload $w on $broker: warren-perf ${ARGS[$w]} --duration $dur"
    local rc=0
    # shellcheck disable=SC2086
    timeout --kill-after=5 $((dur + 90)) "$PERF" --uri "$(uri_of "$broker")" ${ARGS[$w]} \
        --duration "$dur" >"$out.out" 2>&1 || rc=$?
    rm -f "$flag"
    wait "$sampler" || true
    echo "$rc" >"$out.rc"
    if [ "$broker" = warren ] && ! kill -0 "$WARREN_PID" 2>/dev/null; then
        echo "broker process died during the workload" >"$out.crash"
        log "Warren died during workload $w; last log lines:"
        tail -20 "$WORK/warren.log" >&2
    fi
    local line
    line=$(grep '^{' "$out.out" | tail -1 || true)
    if [ -z "$line" ]; then
        line=$(jq -cn --arg e "warren-perf exited $rc without a report: $(tail -3 "$out.out" | tr '\n' ' ')" '{errors:[$e]}')
    fi
    echo "$line" >"$out.json"
    log "  -> rc=$rc $(jq -r '"consumed/s(median) \(.consume_rate_median // "-") p50 \(.latency_p50_us // "-")us p99 \(.latency_p99_us // "-")us missing \(.missing // "-") dup \(.duplicates // "-") errors \((.errors // []) | length)"' "$out.json")"
}

for b in $BROKERS; do ensure_broker "$b"; done

# The idle-connection memory test runs first, on freshly started brokers:
# after a throughput workload the allocators keep freed memory, and new
# connections would reuse it without raising RSS.
RUN_ORDER=""
case " $WORKLOADS " in *" h "*) RUN_ORDER="h" ;; esac
for w in $WORKLOADS; do [ "$w" = h ] || RUN_ORDER="$RUN_ORDER $w"; done
for w in $RUN_ORDER; do
    for b in $BROKERS; do
        pause_others "$b"
        run_one "$b" "$w"
        resume_all
    done
done

# ---- report --------------------------------------------------------------
j() { jq -r "$2 // empty" "$WORK/$1.json" 2>/dev/null || true; }
mb() { awk -v k="$1" 'BEGIN { if (k == "" || k == 0) print "-"; else printf "%.0f", k / 1024 }'; }

cell_rate() { # broker workload
    local f="$WORK/$2.$1"
    [ -e "$f.json" ] || { echo "-"; return; }
    if [ "$2" = h ]; then
        local opened base peak
        opened=$(j "$2.$1" .idle_connections_opened)
        base=$(cat "$f.base"); peak=$(cat "$f.rss")
        awk -v o="${opened:-0}" -v b="$base" -v p="$peak" -v n="$IDLE_CONNS" \
            'BEGIN { printf "%d/%d open, %.1f KB/conn", o, n, (p - b) / n }'
        return
    fi
    local r
    r=$(j "$2.$1" .consume_rate_median)
    [ -n "$r" ] && printf "%.0f" "$r" || echo "FAIL"
}
cell_lat() {
    local f="$WORK/$2.$1"
    [ -e "$f.json" ] && [ "$2" != h ] || { echo "-"; return; }
    local p50 p99
    p50=$(j "$2.$1" .latency_p50_us); p99=$(j "$2.$1" .latency_p99_us)
    [ -n "$p50" ] && echo "$p50 / $p99" || echo "-"
}
cell_rss() {
    local f="$WORK/$2.$1"
    [ -e "$f.rss" ] || { echo "-"; return; }
    mb "$(cat "$f.rss")"
}
cell_check() {
    local f="$WORK/$2.$1" m d e
    [ -e "$f.json" ] || { echo "-"; return; }
    m=$(j "$2.$1" .missing); d=$(j "$2.$1" .duplicates)
    e=$(jq -r '(.errors // []) | length' "$f.json")
    local s="${m:--}/${d:--}"
    [ "$2" = h ] && s="-"
    [ "$e" != 0 ] && s="$s, $e errors"
    [ -e "$f.crash" ] && s="$s, CRASHED"
    echo "$s"
}

{
    echo "# Warren vs RabbitMQ — $STAMP"
    echo
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM"
    echo "- warren: $WARREN_REV ($("$WARREN" --version 2>/dev/null || echo warren))"
    if want rabbitmq; then
        echo "- rabbitmq: $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo unknown), erlang $(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null || echo unknown)"
    fi
    echo "- duration per workload: ${DURATION} s, 1 KB messages unless noted; runs alternate brokers per workload; (h) runs first, on fresh brokers"
    echo "- msg/s = median of per-second consumed rate (first and last second dropped); latency = end-to-end publish->deliver, µs"
    echo "- RSS = peak VmRSS of the broker during the workload (RabbitMQ: sum of beam.smp), MB; missing/dup = exactly-once check"
    echo
    if [ "$BROKERS" = "warren rabbitmq" ]; then
        echo "| workload | Warren msg/s | RabbitMQ msg/s | ratio W/R | Warren p50/p99 µs | RabbitMQ p50/p99 µs | Warren RSS MB | RabbitMQ RSS MB | Warren missing/dup | RabbitMQ missing/dup |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
        for w in $WORKLOADS; do
            wr=$(cell_rate warren "$w"); rr=$(cell_rate rabbitmq "$w")
            ratio=$(awk -v a="$wr" -v b="$rr" 'BEGIN { if (a+0 > 0 && b+0 > 0 && a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/) printf "%.2f", a / b; else print "-" }')
            if [ "$w" = h ]; then
                ratio=$(awk -v wb="$(cat "$WORK/h.warren.base" 2>/dev/null || echo 0)" -v wp="$(cat "$WORK/h.warren.rss" 2>/dev/null || echo 0)" \
                    -v rb="$(cat "$WORK/h.rabbitmq.base" 2>/dev/null || echo 0)" -v rp="$(cat "$WORK/h.rabbitmq.rss" 2>/dev/null || echo 0)" \
                    'BEGIN { if (rp - rb > 0) printf "%.2f (mem)", (wp - wb) / (rp - rb); else print "-" }')
            fi
            echo "| ($w) ${DESC[$w]} | $wr | $rr | $ratio | $(cell_lat warren "$w") | $(cell_lat rabbitmq "$w") | $(cell_rss warren "$w") | $(cell_rss rabbitmq "$w") | $(cell_check warren "$w") | $(cell_check rabbitmq "$w") |"
        done
    else
        b=$BROKERS
        echo "| workload | $b msg/s | $b p50/p99 µs | $b RSS MB | $b missing/dup |"
        echo "|---|---:|---:|---:|---|"
        for w in $WORKLOADS; do
            echo "| ($w) ${DESC[$w]} | $(cell_rate "$b" "$w") | $(cell_lat "$b" "$w") | $(cell_rss "$b" "$w") | $(cell_check "$b" "$w") |"
        done
    fi
    errs=""
    for w in $WORKLOADS; do
        for b in $BROKERS; do
            f="$WORK/$w.$b"
            [ -e "$f.json" ] || continue
            e=$(jq -r '(.errors // [])[]' "$f.json" 2>/dev/null | head -5)
            [ -e "$f.crash" ] && e="$(cat "$f.crash")${e:+; $e}"
            [ -n "$e" ] && errs="$errs"$'\n'"- ($w) $b: $(echo "$e" | tr '\n' ';' | sed 's/;$//')"
        done
    done
    if [ -n "$errs" ]; then
        echo
        echo "Errors reported:"
        echo "$errs"
    fi
    echo
    echo "Commands: \`warren-perf --uri URI <args> --duration $DURATION\` with:"
    echo
    for w in $WORKLOADS; do echo "- ($w) \`${ARGS[$w]}\`"; done
} >"$RESULT_MD"

cat "$RESULT_MD"
mkdir -p "$ROOT/bench/results/raw-$STAMP"
cp "$WORK"/*.json "$WORK"/*.out "$ROOT/bench/results/raw-$STAMP/" 2>/dev/null || true
log "results written to $RESULT_MD (raw output in bench/results/raw-$STAMP)"
rm -rf "$WORK"
