#!/usr/bin/env bash
# Quorum queues on 3 nodes: a 3-node Warren cluster vs a 3-node RabbitMQ cluster, same run.
#
#   bench/cluster-compare.sh                       # ROUNDS=3, DURATION=20 s per run
#   ROUNDS=1 DURATION=10 bench/cluster-compare.sh  # shorter
#   WORKLOADS=q16 bench/cluster-compare.sh         # one workload (q1, q16)
#
# Both clusters run on 127.0.0.1. Warren: three `warren` processes (WARREN, default
# target/release/warren) with their own data directories in a temporary directory and a fresh
# shared secret; AMQP on WARREN_PORT+0..2 (default 5781-5783), cluster on WARREN_PORT+20000..,
# management on WARREN_PORT+10000... RabbitMQ: Debian's rabbitmq-server (installed if missing)
# started three times as RABBIT_PREFIX1@localhost .. RABBIT_PREFIX3@localhost (default
# rabbit1..3), AMQP on RABBIT_PORT+0..2 (default 5791-5793), distribution on RABBIT_PORT+20000..,
# their own mnesia and log directories, no plugins (so no management listener), the Erlang
# cookie of the rabbitmq user; nodes 2 and 3 join node 1 (stop_app, join_cluster, start_app).
# RABBITMQ_* variables of the environment reach the nodes, e.g.
# RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='+sbwt none' (no scheduler busy-waiting).
#
# Each round runs every workload on Warren, then on RabbitMQ: warren-perf (PERF, default
# target/release/warren-perf) against node 1 with --queue-type quorum --persistent
# --confirm CONFIRM (100) --prefetch PREFETCH (100) --size 1024, so the queues are declared on
# node 1 and led by it, with 3 members each. The cluster not under test is paused (SIGSTOP on
# every node) meanwhile, as bench/compare.sh does. Broker CPU is summed over the three nodes.
# The table (median msg/s over the rounds, Warren/RabbitMQ) goes to stdout and
# bench/results/cluster-compare-<timestamp>.md; every process started is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-20}
CONFIRM=${CONFIRM:-100}
PREFETCH=${PREFETCH:-100}
WORKLOADS=${WORKLOADS:-"q1 q16"}
WARREN_PORT=${WARREN_PORT:-5781}
RABBIT_PORT=${RABBIT_PORT:-5791}
RABBIT_PREFIX=${RABBIT_PREFIX:-rabbit}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WARREN=${WARREN:-$TARGET_DIR/release/warren}
PERF=${PERF:-$TARGET_DIR/release/warren-perf}

declare -A DESC ARGS
DESC[q1]="1 quorum queue, 1p/1c, 1 KB persistent, confirms ($CONFIRM)"
ARGS[q1]="--queues 1 --producers 1 --consumers 1"
DESC[q16]="16 quorum queues, 16p/16c, 1 KB persistent, confirms ($CONFIRM)"
ARGS[q16]="--queues 16 --producers 16 --consumers 16"
COMMON="--queue-type quorum --persistent --confirm $CONFIRM --prefetch $PREFETCH --size 1024"

log() { echo "[cluster-compare] $(date +%H:%M:%S) $*" >&2; }

case "$WARREN" in /*) ;; *) WARREN=$(pwd)/$WARREN ;; esac
case "$PERF" in /*) ;; *) PERF=$(pwd)/$PERF ;; esac
[ -x "$WARREN" ] || { log "no warren binary at $WARREN (build it or set WARREN)"; exit 2; }
[ -x "$PERF" ] || { log "no warren-perf binary at $PERF (build it or set PERF)"; exit 2; }
"$PERF" --help | grep -q -- --queue-type || { log "$PERF has no --queue-type"; exit 2; }
for w in $WORKLOADS; do [ -n "${ARGS[$w]:-}" ] || { log "unknown workload $w (q1, q16)"; exit 64; }; done

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
    local port=$1 secs=$2
    for _ in $(seq $((secs * 10))); do
        port_open "$port" && return 0
        sleep 0.1
    done
    return 1
}
for i in 0 1 2; do
    for p in $((WARREN_PORT + i)) $((WARREN_PORT + 10000 + i)) $((WARREN_PORT + 20000 + i)) \
        $((RABBIT_PORT + i)) $((RABBIT_PORT + 20000 + i)); do
        if port_open "$p"; then
            log "port $p is in use; set WARREN_PORT / RABBIT_PORT to free ranges"
            exit 1
        fi
    done
done

command -v jq >/dev/null || { log "installing jq"; apt-get update -qq && apt-get install -y -qq jq >/dev/null; }
if ! command -v rabbitmq-server >/dev/null; then
    log "installing rabbitmq-server from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
fi
# epmd is started by the first Erlang node (or rabbitmqctl) if it is not running; if so, it is
# stopped at the end, unless other nodes registered with it meanwhile.
EPMD_WAS_RUNNING=0
pgrep -x epmd >/dev/null && EPMD_WAS_RUNNING=1
for i in 1 2 3; do
    if rabbitmqctl -n "$RABBIT_PREFIX$i@localhost" -q ping >/dev/null 2>&1; then
        log "a node $RABBIT_PREFIX$i@localhost already runs; set RABBIT_PREFIX to another name"
        exit 1
    fi
done

STAMP=$(date +%Y-%m-%dT%H%M%S)
WARREN_REV=$(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo unknown)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/warren-cluster-compare.XXXXXX")
chmod 755 "$WORK"
mkdir -p "$ROOT/bench/results"
RESULT_MD="$ROOT/bench/results/cluster-compare-$STAMP.md"
LOAD_LOG="$WORK/load"
WARREN_PIDS=()
RABBIT_STARTED=0
LOAD_SAMPLER=""

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# ---- process bookkeeping ------------------------------------------------------
# RabbitMQ node i's processes: beam.smp (found by the socket listening on its AMQP port, so
# another node on the machine is never touched) and its erl_child_setup.
rabbit_node_pids() {
    local beam
    beam=$(ss -ltnpH "sport = :$((RABBIT_PORT + $1 - 1))" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
    [ -n "$beam" ] || return 0
    echo "$beam"
    pgrep -P "$beam" -x erl_child_setup || true
}
rabbit_pids() { local i; for i in 1 2 3; do rabbit_node_pids "$i"; done; }
warren_pids() { local p; for p in "${WARREN_PIDS[@]}"; do echo "$p"; done; }
cluster_pids() { case "$1" in warren) warren_pids ;; rabbitmq) rabbit_pids ;; esac; }
signal_cluster() { local p; for p in $(cluster_pids "$2"); do kill "-$1" "$p" 2>/dev/null || true; done; }

# Stopping processes of this script's group while it is orphaned makes the kernel send SIGHUP.
trap '' HUP

stop_rabbit() {
    [ "$RABBIT_STARTED" = 1 ] || return 0
    local pids p i
    pids=$(rabbit_pids | tr '\n' ' ')
    # also the beam processes of nodes that never opened their AMQP port
    for i in 1 2 3; do
        [ -f "$WORK/rabbit$i/rabbit.pid" ] && pids="$pids $(cat "$WORK/rabbit$i/rabbit.pid")"
    done
    for p in $pids; do kill -CONT "$p" 2>/dev/null || true; done
    for i in 3 2 1; do
        timeout 60 rabbitmqctl -n "$RABBIT_PREFIX$i@localhost" stop >/dev/null 2>&1 || true
    done
    for _ in $(seq 100); do
        local alive=0
        for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.2
    done
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
    RABBIT_STARTED=0
}

stop_warren() {
    local p
    for p in "${WARREN_PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
    for _ in $(seq 100); do
        local alive=0
        for p in "${WARREN_PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for p in "${WARREN_PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    WARREN_PIDS=()
}

cleanup() {
    set +e
    [ -n "$LOAD_SAMPLER" ] && kill "$LOAD_SAMPLER" 2>/dev/null
    stop_warren
    stop_rabbit
    if [ "$EPMD_WAS_RUNNING" = 0 ] && command -v epmd >/dev/null \
        && ! epmd -names 2>/dev/null | grep -q '^name '; then
        epmd -kill >/dev/null 2>&1
    fi
    if [ "${KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

( while :; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 5; done ) >"$LOAD_LOG" 2>/dev/null &
LOAD_SAMPLER=$!

# ---- Warren cluster ------------------------------------------------------------
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/warren-secret"
echo >>"$WORK/warren-secret"
SEEDS="1@127.0.0.1:$((WARREN_PORT + 20000)),2@127.0.0.1:$((WARREN_PORT + 20001)),3@127.0.0.1:$((WARREN_PORT + 20002))"
log "starting 3 Warren nodes on 127.0.0.1:$WARREN_PORT-$((WARREN_PORT + 2)) ($WARREN)"
for i in 1 2 3; do
    mkdir -p "$WORK/warren$i"
    # the broker refuses WARREN_* variables it does not know: pass on only the cluster's
    env $(compgen -e | grep '^WARREN_' | sed 's/^/-u /') \
        WARREN_CLUSTER_NODE_ID=$i WARREN_CLUSTER_LISTEN=127.0.0.1:$((WARREN_PORT + 20000 + i - 1)) \
        WARREN_CLUSTER_SEED_NODES=$SEEDS WARREN_CLUSTER_SECRET_FILE=$WORK/warren-secret \
        "$WARREN" --amqp-listen "127.0.0.1:$((WARREN_PORT + i - 1))" \
        --management-listen "127.0.0.1:$((WARREN_PORT + 10000 + i - 1))" \
        --httpmq-listen 127.0.0.1:0 --data-dir "$WORK/warren$i" --log-level info \
        >>"$WORK/warren$i.log" 2>&1 &
    WARREN_PIDS+=("$!")
done
for i in 1 2 3; do
    wait_port $((WARREN_PORT + i - 1)) 120 || { log "Warren node $i did not start:"; tail -20 "$WORK/warren$i.log" >&2; exit 1; }
done

# A quorum queue declared on node 1 has a member on nodes 2 and 3 only if node 1 reaches them
# when it is declared: check that it does (after start and after every pause) with a probe
# queue, declared on node 1 and looked up on nodes 2 and 3.
warren_ctl() { "$WARREN" ctl -P "$((WARREN_PORT + 10000 + $1 - 1))" --timeout 5 "${@:2}"; }
warren_ready() {
    local q i ok
    for _ in $(seq 30); do
        q=cluster-compare-probe-$RANDOM
        ok=0
        if warren_ctl 1 declare queue --name "$q" --type quorum >/dev/null 2>&1; then
            ok=1
            for _ in $(seq 20); do
                ok=1
                for i in 2 3; do
                    warren_ctl "$i" list queues --json 2>/dev/null | jq -e --arg q "$q" 'any(.[]; .name == $q)' >/dev/null || ok=0
                done
                [ "$ok" = 1 ] && break
                sleep 0.25
            done
            warren_ctl 1 delete queue --name "$q" >/dev/null 2>&1 || true
        fi
        [ "$ok" = 1 ] && return 0
        sleep 1
    done
    return 1
}
warren_ready || { log "Warren: a quorum queue declared on node 1 never got members on nodes 2 and 3"; exit 1; }
log "Warren cluster ready (pids $(warren_pids | paste -sd' '))"

# ---- RabbitMQ cluster -----------------------------------------------------------
# Debian's wrapper switches user through su, whose PAM limits reset the open-file limit; drop
# privileges with setpriv instead (as bench/compare.sh does). All three nodes use the rabbitmq
# user's HOME, hence one Erlang cookie, which rabbitmqctl uses too.
RABBIT_CMD=(rabbitmq-server)
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id rabbitmq >/dev/null 2>&1 \
    && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
    RABBIT_CMD=(setpriv --reuid rabbitmq --regid rabbitmq --init-groups
        env HOME=/var/lib/rabbitmq /usr/lib/rabbitmq/bin/rabbitmq-server)
    if [ ! -s /var/lib/rabbitmq/.erlang.cookie ]; then
        head -c 15 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F >/var/lib/rabbitmq/.erlang.cookie
        chown rabbitmq:rabbitmq /var/lib/rabbitmq/.erlang.cookie
        chmod 400 /var/lib/rabbitmq/.erlang.cookie
    fi
fi
rabbitctl() { timeout 120 rabbitmqctl -n "$RABBIT_PREFIX$1@localhost" "${@:2}"; }
launch_rabbit() {
    local i=$1 d="$WORK/rabbit$1"
    mkdir -p "$d/mnesia" "$d/log"
    echo "[]." >"$d/enabled_plugins"
    id rabbitmq >/dev/null 2>&1 && chown -R rabbitmq:rabbitmq "$d"
    (cd "$d"
        RABBITMQ_NODENAME=$RABBIT_PREFIX$i@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
            RABBITMQ_NODE_PORT=$((RABBIT_PORT + i - 1)) RABBITMQ_DIST_PORT=$((RABBIT_PORT + 20000 + i - 1)) \
            RABBITMQ_MNESIA_BASE=$d/mnesia RABBITMQ_LOG_BASE=$d/log RABBITMQ_PID_FILE=$d/rabbit.pid \
            RABBITMQ_ENABLED_PLUGINS_FILE=$d/enabled_plugins \
            exec setsid "${RABBIT_CMD[@]}" >>"$WORK/rabbit$i.log" 2>&1 </dev/null) &
    RABBIT_STARTED=1
}
log "starting 3 RabbitMQ nodes $RABBIT_PREFIX{1,2,3}@localhost on 127.0.0.1:$RABBIT_PORT-$((RABBIT_PORT + 2))"
for i in 1 2 3; do launch_rabbit "$i"; done
for i in 1 2 3; do
    wait_port $((RABBIT_PORT + i - 1)) 240 || { log "RabbitMQ node $i did not start:"; tail -30 "$WORK/rabbit$i.log" >&2; exit 1; }
    rabbitctl "$i" await_startup >/dev/null
done
for i in 2 3; do
    rabbitctl "$i" stop_app >/dev/null
    rabbitctl "$i" join_cluster "${RABBIT_PREFIX}1@localhost" >/dev/null
    rabbitctl "$i" start_app >/dev/null
done
for i in 2 3; do wait_port $((RABBIT_PORT + i - 1)) 120 || { log "RabbitMQ node $i did not come back after joining"; exit 1; }; done
running=$(rabbitctl 1 cluster_status --formatter json | jq -r '.running_nodes | length')
[ "$running" = 3 ] || { log "RabbitMQ cluster has $running running nodes, not 3"; rabbitctl 1 cluster_status >&2; exit 1; }
log "RabbitMQ cluster ready (pids $(rabbit_pids | paste -sd' '))"

# ---- runs ------------------------------------------------------------------------
uri_of() {
    case "$1" in
        warren) echo "amqp://guest:guest@127.0.0.1:$WARREN_PORT/%2f" ;;
        rabbitmq) echo "amqp://guest:guest@127.0.0.1:$RABBIT_PORT/%2f" ;;
    esac
}
other() { [ "$1" = warren ] && echo rabbitmq || echo warren; }

run_one() { # broker workload round
    local b=$1 w=$2 r=$3 out="$WORK/$2.$1.$3" rc=0 line
    signal_cluster STOP "$(other "$b")"
    if [ "$b" = warren ] && ! warren_ready; then
        log "Warren: quorum queues do not get 3 members (see the node logs)"
        echo "probe: a quorum queue declared on node 1 did not reach nodes 2 and 3" >"$out.note"
    fi
    sleep 1
    log "round $r, $w on $b: warren-perf ${ARGS[$w]} $COMMON --duration $DURATION"
    cut -d' ' -f1 /proc/loadavg >"$out.load"
    # shellcheck disable=SC2086
    timeout --kill-after=10 $((DURATION + 300)) "$PERF" --uri "$(uri_of "$b")" ${ARGS[$w]} $COMMON \
        --duration "$DURATION" --broker-pid "$(cluster_pids "$b" | paste -sd,)" --json >"$out.out" 2>&1 || rc=$?
    line=$(grep '^{' "$out.out" | tail -1 || true)
    [ -n "$line" ] || line=$(jq -cn --arg e "warren-perf exited $rc without a report: $(tail -3 "$out.out" | tr '\n' ' ')" '{errors:[$e]}')
    echo "$line" >"$out.json"
    local p dead=""
    for p in $(cluster_pids "$b"); do kill -0 "$p" 2>/dev/null || dead="$dead $p"; done
    if [ "$b" = warren ]; then
        for p in "${WARREN_PIDS[@]}"; do kill -0 "$p" 2>/dev/null || dead="$dead $p"; done
    fi
    [ -n "$dead" ] && echo "broker process(es)$dead died during the run" >>"$out.note"
    log "  -> $(jq -c '{consume_rate_median, published, confirmed, nacked, consumed, missing, duplicates, errors: ((.errors // []) | length), cpu: .cpu.broker_cpu_pct}' "$out.json" 2>/dev/null || head -c 300 "$out.json")"
    signal_cluster CONT "$(other "$b")"
    sleep 2
}

for r in $(seq "$ROUNDS"); do
    for w in $WORKLOADS; do
        for b in warren rabbitmq; do run_one "$b" "$w" "$r"; done
    done
done
kill "$LOAD_SAMPLER" 2>/dev/null || true
LOAD_SAMPLER=""

# ---- report ----------------------------------------------------------------------
jf() { jq -r "$2 // empty" "$1" 2>/dev/null || true; }
median() { sort -g | awk '{a[NR]=$1} END { if (NR == 0) print "-"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2] + a[NR/2+1]) / 2 }'; }
rates() { # broker workload: one rate per round
    local r v
    for r in $(seq "$ROUNDS"); do
        v=$(jf "$WORK/$2.$1.$r.json" .consume_rate_median)
        [ -n "$v" ] && echo "$v"
    done
}
rounds_cell() { # broker workload
    local r v s=""
    for r in $(seq "$ROUNDS"); do
        v=$(jf "$WORK/$2.$1.$r.json" .consume_rate_median)
        s="$s${s:+, }$(if [ -n "$v" ]; then printf '%.0f' "$v"; else echo FAIL; fi)"
    done
    echo "$s"
}
med_field() { # broker workload jq-path
    local r
    for r in $(seq "$ROUNDS"); do jf "$WORK/$2.$1.$r.json" "$3"; done | median
}
sum_field() {
    local r t=0 v
    for r in $(seq "$ROUNDS"); do
        v=$(jf "$WORK/$2.$1.$r.json" "$3"); t=$((t + ${v:-0}))
    done
    echo "$t"
}
errors_count() {
    local r t=0 v
    for r in $(seq "$ROUNDS"); do
        v=$(jq -r '(.errors // []) | length' "$WORK/$2.$1.$r.json" 2>/dev/null || echo 1); t=$((t + v))
    done
    echo "$t"
}
fmt0() { awk -v a="$1" 'BEGIN { if (a ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) printf "%.0f", a; else print "-" }'; }

{
    echo "# Quorum queues, 3-node Warren vs 3-node RabbitMQ — $STAMP"
    echo
    echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/^Mem:/ {print $2}') GiB RAM; both clusters (3 processes each) and the load generator on it"
    echo "- load average during the run (1 min): min $(awk '{print $2}' "$LOAD_LOG" | sort -g | head -1), median $(awk '{print $2}' "$LOAD_LOG" | median), max $(awk '{print $2}' "$LOAD_LOG" | sort -g | tail -1)"
    echo "- warren: $WARREN_REV ($("$WARREN" --version 2>/dev/null || echo warren))"
    echo "- rabbitmq: $(dpkg-query -W -f '${Version}' rabbitmq-server 2>/dev/null || echo unknown), erlang $(dpkg-query -W -f '${Version}' erlang-base 2>/dev/null || echo unknown), 3 nodes joined with join_cluster, no plugins"
    if [ -n "${RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS:-}" ]; then
        echo "- RabbitMQ nodes started with RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='$RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS'"
    fi
    echo "- $ROUNDS rounds of ${DURATION} s per workload and broker, alternating Warren then RabbitMQ; the other cluster paused (SIGSTOP) meanwhile"
    echo "- msg/s = median of per-second consumed rate (first and last second dropped) per round; the table shows the median over rounds, and every round"
    echo "- CPU = broker CPU % summed over the 3 nodes / load generator CPU % (100 = one core), medians over rounds; latency = end-to-end publish->deliver p50 / p99 µs, medians over rounds"
    echo
    echo "| workload | Warren msg/s | RabbitMQ msg/s | ratio W/R | Warren rounds | RabbitMQ rounds | Warren CPU % broker/loadgen | RabbitMQ CPU % broker/loadgen | Warren latency µs | RabbitMQ latency µs | Warren nacked/missing/dup/errors | RabbitMQ nacked/missing/dup/errors |"
    echo "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|"
    for w in $WORKLOADS; do
        wm=$(rates warren "$w" | median); rm_=$(rates rabbitmq "$w" | median)
        ratio=$(awk -v a="$wm" -v b="$rm_" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else print "-" }')
        cells=""
        for b in warren rabbitmq; do
            cells="$cells | $(fmt0 "$(med_field "$b" "$w" .cpu.broker_cpu_pct)") / $(fmt0 "$(med_field "$b" "$w" .cpu.client_cpu_pct)")"
        done
        for b in warren rabbitmq; do
            cells="$cells | $(fmt0 "$(med_field "$b" "$w" .latency_p50_us)") / $(fmt0 "$(med_field "$b" "$w" .latency_p99_us)")"
        done
        for b in warren rabbitmq; do
            cells="$cells | $(sum_field "$b" "$w" .nacked)/$(sum_field "$b" "$w" .missing)/$(sum_field "$b" "$w" .duplicates)/$(errors_count "$b" "$w")"
        done
        echo "| ${DESC[$w]} | $(fmt0 "$wm") | $(fmt0 "$rm_") | $ratio | $(rounds_cell warren "$w") | $(rounds_cell rabbitmq "$w")$cells |"
    done
    echo
    echo "Broker RSS at the end of each round's publishing window, summed over the 3 nodes, MB (rounds in run order):"
    echo
    echo "| workload | Warren | RabbitMQ |"
    echo "|---|---|---|"
    for w in $WORKLOADS; do
        cells=""
        for b in warren rabbitmq; do
            c=""
            for r in $(seq "$ROUNDS"); do
                c="$c${c:+, }$(fmt0 "$(jf "$WORK/$w.$b.$r.json" .cpu.broker_rss_kb | awk '{ print $1 / 1024 }')")"
            done
            cells="$cells | $c"
        done
        echo "| $w$cells |"
    done
    notes=""
    for w in $WORKLOADS; do
        for b in warren rabbitmq; do
            for r in $(seq "$ROUNDS"); do
                f="$WORK/$w.$b.$r"
                e=$(jq -r '(.errors // [])[]' "$f.json" 2>/dev/null | head -5 | tr '\n' ';' | sed 's/;$//')
                [ -e "$f.note" ] && e="$(tr '\n' ' ' <"$f.note")${e:+; $e}"
                [ -n "$e" ] && notes="$notes"$'\n'"- $w, $b, round $r: $e"
            done
        done
    done
    if [ -n "$notes" ]; then
        echo
        echo "Errors reported:"
        echo "$notes"
    fi
    echo
    echo "Commands (URI = node 1 of each cluster; PIDS = every process of the 3 nodes):"
    echo
    for w in $WORKLOADS; do
        echo "- ${w}: \`warren-perf --uri URI ${ARGS[$w]} $COMMON --duration $DURATION --broker-pid PIDS --json\`"
    done
} >"$RESULT_MD"

cat "$RESULT_MD"
mkdir -p "$ROOT/bench/results/raw-cluster-compare-$STAMP"
cp "$WORK"/*.json "$WORK"/*.out "$ROOT/bench/results/raw-cluster-compare-$STAMP/" 2>/dev/null || true
log "results written to $RESULT_MD (raw output in bench/results/raw-cluster-compare-$STAMP)"
