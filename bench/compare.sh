#!/usr/bin/env bash
# Side-by-side benchmark: Warren vs RabbitMQ, same workloads, same run.
#
#   bench/compare.sh                 # both brokers, every workload, DURATION=10 s each
#   DURATION=5 bench/compare.sh      # shorter
#   bench/compare.sh --only warren   # skip RabbitMQ
#   bench/compare.sh --only rabbitmq # skip Warren
#   WORKLOADS="a b g" bench/compare.sh
#   WORKLOADS="i j k l m10 m30 m50 rt rp rf relay" bench/compare.sh   # scale + ceiling rows
#
# Sizes (CI-size runs are possible): CHURN_CLIENTS (8), MANY_QUEUES (100000),
# MANY_CONNS (10000), RECOVERY_MSGS (1000000), IDLE_CONNS (1000), RAW_CONFIRM (5000).
#
# Warren is started on 127.0.0.1:${WARREN_PORT:-5680} with a temporary data
# directory and stopped at the end. RabbitMQ is used on 127.0.0.1:${RABBIT_PORT:-5672}:
# installed from Debian's rabbitmq-server package if missing, and, if nothing
# listens there, started as its own node (RABBIT_NODE, default warren-bench@<host>)
# with its own data and log directories, and stopped again at the end. A RabbitMQ
# this script did not start is never stopped, paused, killed or restarted (the
# workloads that restart the broker, j's restart and l, are then skipped for it).
# Results go to stdout and bench/results/<date>.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10}
WARREN_PORT=${WARREN_PORT:-5680}
RABBIT_PORT=${RABBIT_PORT:-5672}
RABBIT_NODE=${RABBIT_NODE:-warren-bench@$(hostname -s)}
RELAY_PORT=${RELAY_PORT:-5690}
WORKLOADS=${WORKLOADS:-"a b c d e f g h i j k l m10 m30 m50 rt rp rf relay"}
# Workload sizes and the table of workloads (DESC, ARGS, KIND).
# shellcheck source=bench/workloads.sh
. "$ROOT/bench/workloads.sh"
ONLY=""

while [ $# -gt 0 ]; do
    case "$1" in
        --only) ONLY=${2:?--only needs warren or rabbitmq}; shift 2 ;;
        --only=*) ONLY=${1#--only=}; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 64 ;;
    esac
done
case "$ONLY" in ""|warren|rabbitmq) ;; *) echo "--only takes warren or rabbitmq" >&2; exit 64 ;; esac
BROKERS="warren rabbitmq"
[ -n "$ONLY" ] && BROKERS=$ONLY
want() { case " $BROKERS " in *" $1 "*) return 0 ;; esac; return 1; }

log() { echo "[compare] $(date +%H:%M:%S) $*" >&2; }

for p in "$WARREN_PORT" "$RELAY_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
        echo "port $p is already in use; set WARREN_PORT / RELAY_PORT to free ports" >&2
        exit 1
    fi
done

STAMP=$(date +%Y-%m-%dT%H%M%S)
WARREN_REV=$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)
WORK=$(mktemp -d /tmp/warren-bench.XXXXXX)
mkdir -p "$ROOT/bench/results"
RESULT_MD="$ROOT/bench/results/$STAMP.md"
LOAD_LOG="$WORK/load"

WARREN_PID=""
WARREN_DATA=""
STARTED_RABBIT=0
RABBIT_BASE=""
RELAY_PID=""
LOAD_SAMPLER=""

stop_warren() { # stop_warren [keep]: SIGTERM, then SIGKILL; the data is removed unless "keep"
    if [ -n "$WARREN_PID" ] && kill -0 "$WARREN_PID" 2>/dev/null; then
        kill -CONT "$WARREN_PID" 2>/dev/null || true
        kill "$WARREN_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$WARREN_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$WARREN_PID" 2>/dev/null || true
        wait "$WARREN_PID" 2>/dev/null || true
    fi
    WARREN_PID=""
    if [ "${1:-}" != keep ]; then
        [ -n "$WARREN_DATA" ] && rm -rf "$WARREN_DATA"
        WARREN_DATA=""
    fi
}

# The pids of the RabbitMQ node serving RABBIT_PORT: beam.smp (found by its
# listening socket, so another node on the machine is never touched) and its
# erl_child_setup.
rabbit_pids() {
    local beam
    beam=$(ss -ltnpH "sport = :$RABBIT_PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    [ -n "$beam" ] || return 0
    echo "$beam"
    pgrep -P "$beam" -x erl_child_setup || true
}

rabbitctl() { rabbitmqctl -n "$RABBIT_NODE" "$@"; }

stop_rabbit() {
    if [ "$STARTED_RABBIT" = 1 ]; then
        log "stopping RabbitMQ node $RABBIT_NODE (started by this script)"
        local pids p
        pids=$(rabbit_pids | tr '\n' ' ')
        for p in $pids; do kill -CONT "$p" 2>/dev/null || true; done
        timeout 60 rabbitmqctl -n "$RABBIT_NODE" stop >/dev/null 2>&1 || true
        for _ in $(seq 100); do
            local alive=0
            for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
            [ "$alive" = 0 ] && break
            sleep 0.2
        done
        for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
        STARTED_RABBIT=0
    fi
}

# The broker not under test is paused (SIGSTOP) while the other one runs a workload, and
# resumed (SIGCONT) afterwards: on a 2-core machine an idle Erlang VM still spins its
# schedulers and would take CPU from the broker being measured (an idle Warren takes none,
# but is paused all the same, for symmetry). Only brokers this script started are paused.
# Stopping a process of this script's process group while the group is (or becomes) orphaned,
# e.g. when the script runs detached from the shell that started it, makes the kernel send the
# group SIGHUP; ignore it (children inherit the disposition).
trap '' HUP

broker_pids() {
    case "$1" in
        warren) [ -n "$WARREN_PID" ] && echo "$WARREN_PID" ;;
        rabbitmq) rabbit_pids ;;
        relay) [ -n "$RELAY_PID" ] && echo "$RELAY_PID" ;;
    esac
    return 0
}
pausable() { [ "$1" = warren ] || { [ "$1" = rabbitmq ] && [ "$STARTED_RABBIT" = 1 ]; }; }
pause_others() {
    local o p
    for o in $BROKERS; do
        [ "$o" = "$1" ] && continue
        pausable "$o" || continue
        for p in $(broker_pids "$o"); do kill -STOP "$p" 2>/dev/null || true; done
    done
}
resume_all() {
    local o p
    for o in $BROKERS; do
        pausable "$o" || continue
        for p in $(broker_pids "$o"); do kill -CONT "$p" 2>/dev/null || true; done
    done
}

stop_relay() {
    if [ -n "$RELAY_PID" ]; then
        kill "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_PID" 2>/dev/null || true
        RELAY_PID=""
    fi
}

cleanup() {
    set +e
    [ -n "$LOAD_SAMPLER" ] && kill "$LOAD_SAMPLER" 2>/dev/null || true
    resume_all
    stop_relay
    stop_warren
    stop_rabbit
    [ -n "$RABBIT_BASE" ] && rm -rf "$RABBIT_BASE"
    rm -rf "$WORK"
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
WARREN="${WARREN_BIN:-$TARGET_DIR/release/warren}"

# Both brokers inherit this limit (RabbitMQ through setpriv, below); (k) needs
# MANY_CONNS descriptors in the broker and in warren-perf.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
log "open-file limit: $(ulimit -n)"

# Machine load, sampled every 5 s for the whole run (others may share the cores).
( while :; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 5; done ) >"$LOAD_LOG" 2>/dev/null &
LOAD_SAMPLER=$!

# ---- brokers -------------------------------------------------------------
launch_warren() { # launch on the existing (or a new) data directory, do not wait
    [ -n "$WARREN_DATA" ] || WARREN_DATA=$(mktemp -d /tmp/warren-bench-data.XXXXXX)
    "$WARREN" --amqp-listen "127.0.0.1:$WARREN_PORT" --management-listen 127.0.0.1:0 --httpmq-listen 127.0.0.1:0 --data-dir "$WARREN_DATA" \
        --log-level warn >>"$WORK/warren.log" 2>&1 &
    WARREN_PID=$!
}

start_warren() {
    launch_warren
    if ! wait_port "$WARREN_PORT" 300; then
        log "Warren did not start listening on $WARREN_PORT; log:"
        tail -20 "$WORK/warren.log" >&2
        return 1
    fi
}

launch_rabbit() { # start our own node on RABBIT_PORT, do not wait
    if [ -z "$RABBIT_BASE" ]; then
        RABBIT_BASE=$(mktemp -d /tmp/warren-bench-rabbit.XXXXXX)
        mkdir -p "$RABBIT_BASE/mnesia" "$RABBIT_BASE/log"
        echo "[]." >"$RABBIT_BASE/enabled_plugins"
        id rabbitmq >/dev/null 2>&1 && chown -R rabbitmq:rabbitmq "$RABBIT_BASE"
        chmod 755 "$RABBIT_BASE"
    fi
    # Debian's /usr/sbin/rabbitmq-server switches user through su, whose PAM
    # limits cut the open-file limit to 1024 (~830 AMQP connections). Drop
    # privileges with setpriv instead so the raised limit above is kept.
    local cmd=(rabbitmq-server)
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id rabbitmq >/dev/null 2>&1 \
        && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
        cmd=(setpriv --reuid rabbitmq --regid rabbitmq --init-groups
            env HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
    fi
    (cd "$RABBIT_BASE"
        RABBITMQ_NODENAME=$RABBIT_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
            RABBITMQ_NODE_PORT=$RABBIT_PORT RABBITMQ_DIST_PORT=$((RABBIT_PORT + 20000)) \
            RABBITMQ_MNESIA_BASE=$RABBIT_BASE/mnesia RABBITMQ_LOG_BASE=$RABBIT_BASE/log \
            RABBITMQ_PID_FILE=$RABBIT_BASE/rabbit.pid \
            RABBITMQ_ENABLED_PLUGINS_FILE=$RABBIT_BASE/enabled_plugins \
            exec setsid "${cmd[@]}" >>"$WORK/rabbitmq.log" 2>&1 </dev/null) &
    STARTED_RABBIT=1
}

start_rabbit() {
    if ! command -v rabbitmq-server >/dev/null; then
        log "installing rabbitmq-server from Debian"
        apt-get update -qq
        # The package starts the default node through the init system where there is one;
        # that node is left alone (ours has its own name, port and directories).
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
    fi
    if port_open "$RABBIT_PORT"; then
        log "a RabbitMQ already listens on $RABBIT_PORT: using it as is (never paused, stopped or restarted)"
        return 0
    fi
    log "starting RabbitMQ node $RABBIT_NODE on 127.0.0.1:$RABBIT_PORT"
    launch_rabbit
    if ! wait_port "$RABBIT_PORT" 180; then
        log "RabbitMQ did not start; log:"
        tail -30 "$WORK/rabbitmq.log" >&2
        return 1
    fi
    timeout 60 rabbitmqctl -n "$RABBIT_NODE" await_startup >/dev/null 2>&1 || true
}

# Kill -9 (kill) or stop cleanly (stop) a broker this script started, keeping its data.
halt_broker() {
    local b=$1 how=$2 p pids
    case "$b" in
        warren)
            if [ "$how" = kill ]; then
                kill -9 "$WARREN_PID" 2>/dev/null || true
                wait "$WARREN_PID" 2>/dev/null || true
                WARREN_PID=""
            else
                stop_warren keep
            fi ;;
        rabbitmq)
            pids=$(rabbit_pids | tr '\n' ' ')
            if [ "$how" = kill ]; then
                for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
            else
                timeout 120 rabbitmqctl -n "$RABBIT_NODE" stop >/dev/null 2>&1 || true
            fi
            for _ in $(seq 300); do
                local alive=0
                for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
                [ "$alive" = 0 ] && break
                sleep 0.1
            done
            for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
            # epmd may take a moment to forget the node name
            for _ in $(seq 50); do port_open "$RABBIT_PORT" || break; sleep 0.1; done ;;
    esac
}

relaunch_broker() {
    case "$1" in
        warren) launch_warren ;;
        rabbitmq) launch_rabbit ;;
    esac
}

# Fresh state after a workload that leaves many queues or messages behind.
reset_broker() {
    case "$1" in
        warren) stop_warren; start_warren ;;
        rabbitmq)
            if [ "$STARTED_RABBIT" = 1 ]; then
                stop_rabbit
                rm -rf "$RABBIT_BASE"; RABBIT_BASE=""
                start_rabbit
            fi ;;
    esac
}

can_restart() { [ "$1" = warren ] || [ "$STARTED_RABBIT" = 1 ]; }

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
# The table of workloads (DESC, ARGS, KIND) is in bench/workloads.sh, sourced above.
uri_of() {
    case "$1" in
        warren) echo "amqp://guest:guest@127.0.0.1:$WARREN_PORT/%2f" ;;
        rabbitmq) echo "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2f" ;;
        relay) echo "amqp://guest:guest@127.0.0.1:$RELAY_PORT/%2f" ;;
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
        relay)
            if [ -z "$RELAY_PID" ]; then
                "$PERF" --mode relay --listen "127.0.0.1:$RELAY_PORT" >>"$WORK/relay.log" 2>&1 &
                RELAY_PID=$!
                # no probe connection: the relay pairs connections in accept order
                sleep 1
            fi ;;
    esac
}

# run_perf OUT ARGS...: runs warren-perf with a time limit; its JSON line goes to OUT.json.
run_perf() {
    local out=$1; shift
    local rc=0
    timeout --kill-after=10 "${PERF_TIMEOUT:-3600}" "$PERF" "$@" >>"$out.out" 2>&1 || rc=$?
    local line
    line=$(grep '^{' "$out.out" | tail -1 || true)
    [ -n "$line" ] || line=$(jq -cn --arg e "warren-perf exited $rc without a report: $(tail -3 "$out.out" | tr '\n' ' ')" '{errors:[$e]}')
    echo "$line" >"$out.json"
    return 0
}

pids_csv() { broker_pids "$1" | paste -sd, -; }

# (j) after declaring: restart the broker (clean stop) and time it back.
# (l): fill, kill -9, restart and time recovery.
restart_and_check() { # broker out how check-args...
    local b=$1 out=$2 how=$3; shift 3
    local t0 t1
    halt_broker "$b" "$how"
    t0=$(date +%s%N)
    relaunch_broker "$b"
    run_perf "$out.check" --uri "$(uri_of "$b")" --mode restart-check --timeout 900 --json "$@"
    t1=$(date +%s%N)
    # the check measures from its own start, which is the broker's start give or take a few ms
    echo $(((t1 - t0) / 1000000)) >"$out.restart_wall_ms"
    if [ "$b" = rabbitmq ]; then
        wait_port "$RABBIT_PORT" 60 || true
    fi
}

# run_one BROKER WORKLOAD -> writes $WORK/<w>.<broker>.{json,out,rss,base}
run_one() {
    local b=$1 w=$2 flag dur
    local out="$WORK/$w.$b"
    : >"$out.out"
    ensure_broker "$b" || { echo '{"errors":["broker failed to start"]}' >"$out.json"; return; }
    sleep 1
    rss_kb "$b" >"$out.base"
    flag="$WORK/sampling.$w.$b"
    touch "$flag"
    sample_rss "$b" "$flag" "$out.rss" &
    local sampler=$!
    dur=$DURATION
    [ "$w" = h ] && [ "$dur" -lt 5 ] && dur=5
    local uri pids
    uri=$(uri_of "$b"); pids=$(pids_csv "$b")
    log "workload $w on $b: warren-perf ${ARGS[$w]} --duration $dur"
    echo "$(cut -d' ' -f1 /proc/loadavg)" >"$out.load"
    # shellcheck disable=SC2086
    case "$w" in
        j)
            run_perf "$out" --uri "$uri" ${ARGS[$w]} --broker-pid "$pids" --json
            if can_restart "$b"; then
                restart_and_check "$b" "$out" stop --queues "$MANY_QUEUES" \
                    --queue-pattern 'warren-perf-mq-%d' --only-last
            fi ;;
        l)
            run_perf "$out" --uri "$uri" ${ARGS[$w]} --broker-pid "$pids" --json
            if can_restart "$b"; then
                restart_and_check "$b" "$out" kill --queues "$RECOVERY_QUEUES" \
                    --queue-pattern 'warren-perf-rec-%d' --messages "$RECOVERY_MSGS" --get
            fi ;;
        relay)
            run_perf "$out" --uri "$uri" ${ARGS[$w]} --duration "$dur" --broker-pid "$pids" --json ;;
        *)
            run_perf "$out" --uri "$uri" ${ARGS[$w]} --duration "$dur" --broker-pid "$pids" --json ;;
    esac
    rm -f "$flag"
    wait "$sampler" || true
    if [ "$b" = warren ] && { [ -z "$WARREN_PID" ] || ! kill -0 "$WARREN_PID" 2>/dev/null; }; then
        echo "broker process died during the workload" >"$out.crash"
        log "Warren died during workload $w; last log lines:"
        tail -20 "$WORK/warren.log" >&2
    fi
    log "  -> $(head -c 600 "$out.json")"
    [ -e "$out.check.json" ] && log "  restart: $(head -c 400 "$out.check.json")"
    case "$w" in
        j|l)
            if can_restart "$b"; then
                reset_broker "$b"
            else # someone else's broker: remove what the workload left there
                local n=$MANY_QUEUES pat='warren-perf-mq-%d'
                [ "$w" = l ] && { n=$RECOVERY_QUEUES; pat='warren-perf-rec-%d'; }
                run_perf "$out.cleanup" --uri "$uri" --mode delete-queues --queues "$n" --queue-pattern "$pat" --json
            fi ;;
    esac
    return 0
}

for b in $BROKERS; do ensure_broker "$b"; done

# The idle-connection memory test runs first, on freshly started brokers:
# after a throughput workload the allocators keep freed memory, and new
# connections would reuse it without raising RSS. The relay runs last, alone.
RUN_ORDER=""
case " $WORKLOADS " in *" h "*) RUN_ORDER="h" ;; esac
for w in $WORKLOADS; do [ "$w" = h ] || [ "$w" = relay ] || RUN_ORDER="$RUN_ORDER $w"; done
for w in $RUN_ORDER; do
    [ -n "${DESC[$w]:-}" ] || { log "unknown workload $w (skipped)"; continue; }
    for b in $BROKERS; do
        pause_others "$b"
        run_one "$b" "$w"
        resume_all
    done
done
case " $WORKLOADS " in
    *" relay "*)
        pause_others relay
        run_one relay relay
        resume_all
        stop_relay ;;
esac
kill "$LOAD_SAMPLER" 2>/dev/null || true

# ---- report --------------------------------------------------------------
j() { jq -r "$2 // empty" "$WORK/$1.json" 2>/dev/null || true; }
mb() { awk -v k="$1" 'BEGIN { if (k == "" || k == 0) print "-"; else printf "%.0f", k / 1024 }'; }
num() { awk -v a="$1" -v f="${2:-%.0f}" 'BEGIN { if (a ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) printf f, a; else print "-" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else print "-" }'; }

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
cell_lat3() {
    local p50 p99 p999
    p50=$(j "$2.$1" .latency_p50_us); p99=$(j "$2.$1" .latency_p99_us); p999=$(j "$2.$1" .latency_p999_us)
    [ -n "$p50" ] && echo "$p50 / $p99 / $p999" || echo "-"
}
cell_rss() {
    local f="$WORK/$2.$1"
    [ -e "$f.rss" ] || { echo "-"; return; }
    mb "$(cat "$f.rss")"
}
cell_cpu() { # broker CPU % / load generator CPU %
    local f="$WORK/$2.$1" c
    [ -e "$f.json" ] || { echo "-"; return; }
    c=$(jq -r '(.cpu // .declare_cpu) as $c | if $c then "\($c.broker_cpu_pct // "-") / \($c.client_cpu_pct // "-")" else "-" end' "$f.json" 2>/dev/null)
    echo "${c:--}"
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

# Scale rows: the headline figure of a workload, and a line of details.
headline() { # broker workload
    local k="$2.$1"
    [ -e "$WORK/$k.json" ] || { echo "-"; return; }
    case "$2" in
        i) num "$(j "$k" .cycles_per_s)" ;;
        j) num "$(j "$k" .declares_per_s)" ;;
        k) num "$(j "$k" .latency.p99_us)" ;;
        l) num "$(j "$k.check" .first_get_ms)" ;;
        rt|rp|rf|relay) num "$(j "$k" .delivery_rate_median)" ;;
    esac
}
details() { # broker workload
    local k="$2.$1" f="$WORK/$2.$1" s=""
    [ -e "$f.json" ] || { echo "-"; return; }
    local e
    e=$(jq -r '(.errors // []) | length' "$f.json")
    case "$2" in
        i) s="broker $(num "$(j "$k" .broker_cpu_us_per_cycle)" %.1f) µs CPU/cycle, load gen $(num "$(j "$k" .client_cpu_us_per_cycle)" %.1f) µs/cycle; cycle p50/p99 $(j "$k" .cycle_time.p50_us)/$(j "$k" .cycle_time.p99_us) µs; $(j "$k" .failures) failed" ;;
        j) s="$(j "$k" .declared) declared; $(num "$(j "$k" .rss_bytes_per_queue)") B RSS/queue; broker CPU at rest $(num "$(j "$k" .broker_cpu_ms_at_rest_per_s)" %.1f) ms/s; broker $(num "$(j "$k" .broker_cpu_us_per_declare)") µs CPU/declare; restart: listening $(num "$(j "$k.check" .connect_ms)") ms, last queue found $(num "$(j "$k.check" .full_depth_ms)") ms" ;;
        k) s="$(j "$k" .opened)/$(j "$k" .connections) open in $(num "$(j "$k" .open_s)" %.1f) s; latency p50/p99/p99.9 $(j "$k" .latency.p50_us)/$(j "$k" .latency.p99_us)/$(j "$k" .latency.p999_us) µs; $(num "$(j "$k" .consume_rate)") msg/s; broker CPU $(j "$k" .cpu.broker_cpu_pct)%; RSS $(mb "$(j "$k" .rss_open_kb)") MB open ($(num "$(j "$k" .rss_bytes_per_conn)") B/conn), $(mb "$(j "$k" .rss_peak_kb)") MB peak" ;;
        l) s="filled at $(num "$(j "$k" .fill_rate)") msg/s; restart: listening $(num "$(j "$k.check" .connect_ms)") ms, first basic.get $(num "$(j "$k.check" .first_get_ms)") ms, all $RECOVERY_QUEUES queues at full depth $(num "$(j "$k.check" .full_depth_ms)") ms" ;;
        rt|rp|rf|relay) s="broker $(num "$(j "$k" .broker_cpu_us_per_delivery)" %.2f) µs CPU/delivery, load gen $(num "$(j "$k" .client_cpu_us_per_delivery)" %.2f) µs; published $(j "$k" .published), delivered $(j "$k" .delivered), missing $(j "$k" .missing)" ;;
    esac
    [ "$e" != 0 ] && s="$s; $e errors"
    [ -e "$WORK/$k.check.json" ] && [ "$(jq -r '(.errors // []) | length' "$WORK/$k.check.json")" != 0 ] && s="$s; restart check failed"
    [ -e "$f.crash" ] && s="$s; CRASHED"
    echo "$s"
}
# For (k) and (l) lower is better: the ratio is RabbitMQ/Warren there.
scale_ratio() {
    case "$3" in
        k|l) ratio "$2" "$1" ;;
        *) ratio "$1" "$2" ;;
    esac
}

has() { case " $WORKLOADS " in *" $1 "*) return 0 ;; esac; return 1; }

{
    echo "# Warren vs RabbitMQ — $STAMP"
    echo
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM"
    echo "- load average during the run (1 min): min $(awk '{print $2}' "$LOAD_LOG" | sort -n | head -1), median $(awk '{print $2}' "$LOAD_LOG" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'), max $(awk '{print $2}' "$LOAD_LOG" | sort -n | tail -1)"
    echo "- warren: $WARREN_REV ($("$WARREN" --version 2>/dev/null || echo warren))"
    if want rabbitmq; then
        echo "- rabbitmq: $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo unknown), erlang $(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null || echo unknown)"
    fi
    echo "- duration per workload: ${DURATION} s, 1 KB messages unless noted; runs alternate brokers per workload; (h) runs first, on fresh brokers"
    echo "- msg/s = median of per-second consumed rate (first and last second dropped); latency = end-to-end publish->deliver, µs"
    echo "- RSS = peak VmRSS of the broker during the workload (RabbitMQ: beam.smp + erl_child_setup), MB; missing/dup = exactly-once check"
    echo "- CPU = broker CPU % / load generator CPU % over the measured window (100 = one core)"
    echo
    CLASSIC=""; SCALE=""
    for w in $WORKLOADS; do
        case "${KIND[$w]:-}" in scale|relay) SCALE="$SCALE $w" ;; *) CLASSIC="$CLASSIC $w" ;; esac
    done
    if [ "$BROKERS" = "warren rabbitmq" ]; then
        if [ -n "$CLASSIC" ]; then
            echo "| workload | Warren msg/s | RabbitMQ msg/s | ratio W/R | Warren latency µs | RabbitMQ latency µs | Warren RSS MB | RabbitMQ RSS MB | Warren CPU % broker/loadgen | RabbitMQ CPU % broker/loadgen | Warren missing/dup | RabbitMQ missing/dup |"
            echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
            for w in $CLASSIC; do
                wr=$(cell_rate warren "$w"); rr=$(cell_rate rabbitmq "$w")
                rat=$(ratio "$wr" "$rr")
                if [ "$w" = h ]; then
                    rat=$(awk -v wb="$(cat "$WORK/h.warren.base" 2>/dev/null || echo 0)" -v wp="$(cat "$WORK/h.warren.rss" 2>/dev/null || echo 0)" \
                        -v rb="$(cat "$WORK/h.rabbitmq.base" 2>/dev/null || echo 0)" -v rp="$(cat "$WORK/h.rabbitmq.rss" 2>/dev/null || echo 0)" \
                        'BEGIN { if (rp - rb > 0) printf "%.2f (mem)", (wp - wb) / (rp - rb); else print "-" }')
                fi
                if [ "${KIND[$w]:-}" = latency ]; then
                    wl=$(cell_lat3 warren "$w"); rl=$(cell_lat3 rabbitmq "$w")
                else
                    wl=$(cell_lat warren "$w"); rl=$(cell_lat rabbitmq "$w")
                fi
                d=${DESC[$w]}; case "$d" in "("*) ;; *) d="($w) $d" ;; esac
                echo "| $d | $wr | $rr | $rat | $wl | $rl | $(cell_rss warren "$w") | $(cell_rss rabbitmq "$w") | $(cell_cpu warren "$w") | $(cell_cpu rabbitmq "$w") | $(cell_check warren "$w") | $(cell_check rabbitmq "$w") |"
            done
            echo
        fi
        if [ -n "$SCALE" ]; then
            echo "| workload | Warren | RabbitMQ | ratio | Warren RSS MB | RabbitMQ RSS MB | Warren CPU % broker/loadgen | RabbitMQ CPU % broker/loadgen | Warren details | RabbitMQ details |"
            echo "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
            for w in $SCALE; do
                if [ "$w" = relay ]; then
                    echo "| ${DESC[$w]} | $(headline relay relay) | - | - | $(cell_rss relay relay) | - | $(cell_cpu relay relay) | - | $(details relay relay) | - |"
                    continue
                fi
                wh=$(headline warren "$w"); rh=$(headline rabbitmq "$w")
                echo "| ${DESC[$w]} | $wh | $rh | $(scale_ratio "$wh" "$rh" "$w") | $(cell_rss warren "$w") | $(cell_rss rabbitmq "$w") | $(cell_cpu warren "$w") | $(cell_cpu rabbitmq "$w") | $(details warren "$w") | $(details rabbitmq "$w") |"
            done
            echo
            echo "Ratio = Warren/RabbitMQ, except (k) and (l) where lower is better: RabbitMQ/Warren (how many times lower Warren's figure is)."
        fi
    else
        b=$BROKERS
        if [ -n "$CLASSIC" ]; then
            echo "| workload | $b msg/s | $b latency µs | $b RSS MB | $b CPU % broker/loadgen | $b missing/dup |"
            echo "|---|---:|---:|---:|---:|---|"
            for w in $CLASSIC; do
                if [ "${KIND[$w]:-}" = latency ]; then l=$(cell_lat3 "$b" "$w"); else l=$(cell_lat "$b" "$w"); fi
                echo "| ($w) ${DESC[$w]} | $(cell_rate "$b" "$w") | $l | $(cell_rss "$b" "$w") | $(cell_cpu "$b" "$w") | $(cell_check "$b" "$w") |"
            done
            echo
        fi
        if [ -n "$SCALE" ]; then
            echo "| workload | $b | $b RSS MB | $b CPU % broker/loadgen | details |"
            echo "|---|---:|---:|---:|---|"
            for w in $SCALE; do
                bb=$b; [ "$w" = relay ] && bb=relay
                echo "| ${DESC[$w]} | $(headline "$bb" "$w") | $(cell_rss "$bb" "$w") | $(cell_cpu "$bb" "$w") | $(details "$bb" "$w") |"
            done
        fi
    fi
    errs=""
    for w in $WORKLOADS; do
        for b in $BROKERS relay; do
            for f in "$WORK/$w.$b" "$WORK/$w.$b.check"; do
                [ -e "$f.json" ] || continue
                e=$(jq -r '(.errors // [])[]' "$f.json" 2>/dev/null | head -5)
                [ -e "$f.crash" ] && e="$(cat "$f.crash")${e:+; $e}"
                [ -n "$e" ] && errs="$errs"$'\n'"- ($w) $b: $(echo "$e" | tr '\n' ';' | sed 's/;$//')"
            done
        done
    done
    if [ -n "$errs" ]; then
        echo
        echo "Errors reported:"
        echo "$errs"
    fi
    echo
    echo "Commands: \`warren-perf --uri URI <args> --duration $DURATION --broker-pid PIDS\` with:"
    echo
    for w in $WORKLOADS; do [ -n "${ARGS[$w]:-}" ] && echo "- ($w) \`${ARGS[$w]}\`"; done
    has j && echo "- (j) then: broker stopped cleanly and started again, \`--mode restart-check --queues $MANY_QUEUES --queue-pattern 'warren-perf-mq-%d' --only-last\` started with it"
    has l && echo "- (l) then: broker killed with SIGKILL and started again, \`--mode restart-check --queues $RECOVERY_QUEUES --queue-pattern 'warren-perf-rec-%d' --messages $RECOVERY_MSGS --get\` started with it"
    has relay && echo "- (relay) \`warren-perf --mode relay --listen 127.0.0.1:$RELAY_PORT\` as the \"broker\""
} >"$RESULT_MD"

cat "$RESULT_MD"
mkdir -p "$ROOT/bench/results/raw-$STAMP"
cp "$WORK"/*.json "$WORK"/*.out "$ROOT/bench/results/raw-$STAMP/" 2>/dev/null || true
log "results written to $RESULT_MD (raw output in bench/results/raw-$STAMP)"
