#!/usr/bin/env bash
# The httpmq/httpsqs HTTP queue API under load, with Warren's AMQP figures from the same run.
#
#   bench/httpmq.sh                      # everything, DURATION=10 s per wrk run
#   DURATION=5 AB_N=50000 bench/httpmq.sh
#   SKIP_BACKLOG=1 bench/httpmq.sh       # without the 1,000,000-message backlog
#
# Warren (release build) is started on 127.0.0.1:${WARREN_PORT:-5681} (AMQP) and
# 127.0.0.1:${HTTP_PORT:-11218} (httpmq) with a temporary data directory, and stopped at the end.
# Workloads:
#   wrk:     `wrk -t2 -c100` POST puts of 512 B for DURATION s, then GET gets from that
#            queue for DURATION s (gets/s counts messages actually got: HTTPMQ_GET_END
#            replies are not counted);
#   ab:      `ab -k -c 1000 -n AB_N` GET puts of 512 B via `data=`, then AB_N gets;
#   backlog: BACKLOG_N (1,000,000) x 1 KiB POST puts, then as many gets, on a fresh broker;
#            peak RSS (VmHWM) after each phase;
#   floor:   FLOOR_ROUNDS (3) interleaved rounds of the same wrk and ab requests (puts and
#            gets) against the HTTP floor (examples/http_floor.rs: the same hyper stack
#            answering HTTPMQ_PUT_OK with no queue work), of the wrk puts against Warren,
#            and of Warren's `opt=status` (no store); SKIP_FLOOR=1 leaves them out. With
#            the versus rounds, the floor's medians are set beside Warren's and twice
#            httpmq's: the floor is the most this HTTP stack answers on the machine;
#   versus:  with HTTPMQ=<an httpmq binary> (Go + LevelDB, github.com/sysulq/httpmq, built
#            separately), VERSUS_ROUNDS (3) interleaved rounds of the wrk and ab rows above
#            against httpmq and against Warren, each on a fresh data directory, and the ratio
#            of the medians: the issue's targets are ratios to httpmq on the same machine;
#            SKIP_MAIN=1 runs only these rounds (and the floor, unless SKIP_FLOOR=1);
#   amqp:    warren-perf 1p/1c transient and 1p/1c persistent+confirms(100), DURATION s;
#            with BASELINE_WARREN=<another warren binary> (e.g. one built from main), the same
#            rows on it too, alternating, to show what this build costs AMQP.
# Every put is answered after the fsync that covers it, every get after the fsync of its ack.
# CPU shares of the broker and of the load tool are printed (ab is single-threaded), and the
# whole machine's split into user, system, softirq and idle time.
# Needs wrk, ab (apache2-utils) and jq.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-10}
WARREN_PORT=${WARREN_PORT:-5681}
HTTP_PORT=${HTTP_PORT:-11218}
AB_N=${AB_N:-100000}
BACKLOG_N=${BACKLOG_N:-1000000}
SKIP_BACKLOG=${SKIP_BACKLOG:-}
SKIP_FLOOR=${SKIP_FLOOR:-}
FLOOR_ROUNDS=${FLOOR_ROUNDS:-3}
FLOOR_PORT=${FLOOR_PORT:-11299}
BASELINE_WARREN=${BASELINE_WARREN:-}
HTTPMQ=${HTTPMQ:-}
VERSUS_ROUNDS=${VERSUS_ROUNDS:-3}
HTTPMQ_PORT=${HTTPMQ_PORT:-11300}
SKIP_MAIN=${SKIP_MAIN:-}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}

for t in wrk ab jq; do
    command -v "$t" >/dev/null || { echo "needs $t (apt-get install -y wrk apache2-utils jq)" >&2; exit 1; }
done
log() { echo "[httpmq] $(date +%H:%M:%S) $*" >&2; }

log "building warren-server and warren-perf (release)"
(cd "$ROOT" && cargo build --release -p warren-server -p warren-perf \
    && cargo build --release -p warren-httpmq --example http_floor) >&2
WARREN="$TARGET_DIR/release/warren"
PERF="$TARGET_DIR/release/warren-perf"
FLOOR="$TARGET_DIR/release/examples/http_floor"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/warren-httpmq-bench.XXXXXX")
BROKER_PID=""
cleanup() {
    [ -n "$BROKER_PID" ] && kill "$BROKER_PID" 2>/dev/null && wait "$BROKER_PID" 2>/dev/null
    [ -n "${FLOOR_PID:-}" ] && kill "$FLOOR_PID" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
URL="http://127.0.0.1:$HTTP_PORT"

start_broker() { # [binary]
    rm -rf "$WORK/data"
    local bin=${1:-$WARREN} extra=(--httpmq-listen "127.0.0.1:$HTTP_PORT")
    # A baseline built before the httpmq API has no --httpmq-listen.
    "$bin" --help | grep -q -- --httpmq-listen || extra=()
    "$bin" --amqp-listen "127.0.0.1:$WARREN_PORT" --management-listen 127.0.0.1:0 \
        "${extra[@]}" --data-dir "$WORK/data" --log-level warn \
        >>"$WORK/warren.log" 2>&1 &
    BROKER_PID=$!
    for _ in $(seq 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$WARREN_PORT") 2>/dev/null; then
            [ ${#extra[@]} -eq 0 ] && return 0
            curl -s "$URL/" >/dev/null 2>&1 && return 0
        fi
        sleep 0.1
    done
    echo "warren did not start: $(tail -5 "$WORK/warren.log")" >&2
    exit 1
}
stop_broker() {
    kill "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null || true; BROKER_PID=""
}
# CPU ticks (user+system) of a process.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
rss_peak_mb() { awk '/VmHWM/ {printf "%d", $2 / 1024}' "/proc/$BROKER_PID/status"; }
# A queue's positions, from httpsqs's `opt=status` text (which httpmq serves too).
status_field() { # queue field-prefix
    curl -s "$URL/?name=$1&opt=status" | awk -F': ' -v f="$2" 'index($0, f) == 1 {print $2}'
}
getpos() { status_field "$1" 'Get position'; }
putpos() { status_field "$1" 'Put position'; }
unread() { status_field "$1" 'Number of unread'; }

BODY512=$(head -c 512 /dev/zero | tr '\0' 'x')
cat >"$WORK/put.lua" <<EOF
wrk.method = "POST"
wrk.body = string.rep("x", 512)
EOF
# wrk's summary: requests/s and the p50 / p99 latency lines of --latency.
wrk_summary() { # file
    local rps p50 p99
    rps=$(awk '/Requests\/sec/ {print $2}' "$1")
    p50=$(awk '$1 == "50%" {print $2}' "$1")
    p99=$(awk '$1 == "99%" {print $2}' "$1")
    echo "$rps $p50 $p99"
}
ab_summary() { # file
    local rps p50 p99 failed
    rps=$(awk '/Requests per second/ {print $4}' "$1")
    p50=$(awk '$1 == "50%" {print $2}' "$1")
    p99=$(awk '$1 == "99%" {print $2}' "$1")
    echo "$rps ${p50}ms ${p99}ms"
}
# The machine's CPU split between two `cpu` lines of /proc/stat: user (with nice), system,
# softirq (the loopback TCP's packet processing runs there) and idle (with iowait), in %.
cpu_split() { # before after
    paste <(echo "$1") <(echo "$2") | awk '{
        for (i = 2; i <= 9; i++) d[i] = $(i + 11) - $i
        t = 0; for (i = 2; i <= 9; i++) t += d[i]; if (t == 0) t = 1
        printf "us %d sy %d si %d id %d", 100 * (d[2] + d[3]) / t, 100 * d[4] / t, 100 * d[8] / t, 100 * (d[5] + d[6]) / t
    }'
}
timed() { # out-file cmd...: runs cmd, prints broker and tool CPU % of one core, then the
          # machine's split (see cpu_split)
    local out=$1; shift
    local b0 b1 t0 t1 s0 s1
    b0=$(ticks "$BROKER_PID"); t0=$(date +%s%N); s0=$(head -1 /proc/stat)
    /usr/bin/time -f "%P" -o "$out.cpu" "$@" >"$out" 2>&1
    b1=$(ticks "$BROKER_PID"); t1=$(date +%s%N); s1=$(head -1 /proc/stat)
    local secs_x100=$(( (t1 - t0) / 10000000 ))
    echo "$(( (b1 - b0) * 100 * 100 / hz / (secs_x100 > 0 ? secs_x100 : 1) ))% $(tr -d '%' <"$out.cpu")% ($(cpu_split "$s0" "$s1"))"
}

RESULTS="$WORK/results.md"
row() { echo "$*" | tee -a "$RESULTS"; }

# One load run against the floor (BROKER_PID set to the floor's): appends "floor <name> <rate>"
# to $WORK/rates and prints the row of round $round.
floor_run() { # name label tool args...
    local name=$1 label=$2 cpu rps p50 p99
    shift 2
    cpu=$(timed "$WORK/floor-$name" "$@")
    if [ "$1" = wrk ]; then
        read -r rps p50 p99 <<<"$(wrk_summary "$WORK/floor-$name")"
    else
        read -r rps p50 p99 <<<"$(ab_summary "$WORK/floor-$name")"
    fi
    echo "floor $name $rps" >>"$WORK/rates"
    row "| floor round $round: HTTP floor, $label | $rps req/s | $p50 | $p99 | $cpu |"
}

if [ -z "$SKIP_FLOOR" ]; then
    for round in $(seq "$FLOOR_ROUNDS"); do
        log "floor round $round: HTTP floor, Warren put, Warren status"
        "$FLOOR" "127.0.0.1:$FLOOR_PORT" &
        FLOOR_PID=$!
        for _ in $(seq 100); do curl -s "http://127.0.0.1:$FLOOR_PORT/" >/dev/null 2>&1 && break; sleep 0.05; done
        saved=$BROKER_PID; BROKER_PID=$FLOOR_PID
        F="http://127.0.0.1:$FLOOR_PORT"
        floor_run wrk-put "wrk POST 512 B" wrk -t2 -c100 -d"${DURATION}s" --latency -s "$WORK/put.lua" "$F/?name=f&opt=put"
        floor_run ab-put "ab -k -c 1000 -n $AB_N GET data= 512 B" ab -k -c 1000 -n "$AB_N" "$F/?name=f&opt=put&data=$BODY512"
        floor_run wrk-get "wrk GET" wrk -t2 -c100 -d"${DURATION}s" --latency "$F/?name=f&opt=get"
        floor_run ab-get "ab -k -c 1000 -n $AB_N GET" ab -k -c 1000 -n "$AB_N" "$F/?name=f&opt=get"
        BROKER_PID=$saved
        kill "$FLOOR_PID"; wait "$FLOOR_PID" 2>/dev/null || true; FLOOR_PID=""
        start_broker
        cpu=$(timed "$WORK/fput" wrk -t2 -c100 -d"${DURATION}s" --latency -s "$WORK/put.lua" "$URL/?name=floorq&opt=put")
        read -r rps p50 p99 <<<"$(wrk_summary "$WORK/fput")"
        row "| floor round $round: Warren put, wrk POST 512 B | $rps req/s ($(putpos floorq) puts) | $p50 | $p99 | $cpu |"
        cpu=$(timed "$WORK/fstatus" wrk -t2 -c100 -d"${DURATION}s" --latency "$URL/?name=floorq&opt=status")
        read -r rps p50 p99 <<<"$(wrk_summary "$WORK/fstatus")"
        row "| floor round $round: Warren status (no store) | $rps req/s | $p50 | $p99 | $cpu |"
        stop_broker
    done
fi

# One server for the versus rounds: "warren" or "httpmq", on a fresh data directory, at $URL.
start_server() { # kind
    if [ "$1" = httpmq ]; then
        rm -rf "$WORK/hq.db"
        "$HTTPMQ" -ip 127.0.0.1 -port "$HTTPMQ_PORT" -db "$WORK/hq.db" >>"$WORK/httpmq.log" 2>&1 &
        BROKER_PID=$!
        URL="http://127.0.0.1:$HTTPMQ_PORT"
        for _ in $(seq 100); do curl -s "$URL/" >/dev/null 2>&1 && return 0; sleep 0.05; done
        echo "httpmq did not start: $(tail -5 "$WORK/httpmq.log")" >&2
        exit 1
    fi
    URL="http://127.0.0.1:$HTTP_PORT"
    start_broker
}
# The wrk and ab rows against the server at $URL (label prefix, server kind): wrk puts, wrk
# gets from that queue (messages actually got, from `getpos`), ab puts, ab gets. Each rate is
# also appended to $WORK/rates as "<kind> <row> <rate>".
http_rows() { # label-prefix kind
    local p=$1 kind=$2 g0 got
    log "${p}wrk puts"
    cpu=$(timed "$WORK/wrk-put" wrk -t2 -c100 -d"${DURATION}s" --latency -s "$WORK/put.lua" "$URL/?name=wrkq&opt=put")
    read -r rps p50 p99 <<<"$(wrk_summary "$WORK/wrk-put")"
    echo "$kind wrk-put $rps" >>"$WORK/rates"
    row "| ${p}wrk -t2 -c100 POST put 512 B | $rps req/s ($(putpos wrkq) puts) | $p50 | $p99 | $cpu |"
    log "${p}wrk gets"
    g0=$(getpos wrkq)
    cpu=$(timed "$WORK/wrk-get" wrk -t2 -c100 -d"${DURATION}s" --latency "$URL/?name=wrkq&opt=get")
    read -r rps p50 p99 <<<"$(wrk_summary "$WORK/wrk-get")"
    got=$(( $(getpos wrkq) - g0 ))
    echo "$kind wrk-get $((got / DURATION))" >>"$WORK/rates"
    row "| ${p}wrk -t2 -c100 GET get | $rps req/s, $((got / DURATION)) msg/s got ($got got, $(unread wrkq) left) | $p50 | $p99 | $cpu |"
    log "${p}ab puts"
    cpu=$(timed "$WORK/ab-put" ab -k -c 1000 -n "$AB_N" "$URL/?name=abq&opt=put&data=$BODY512")
    read -r rps p50 p99 <<<"$(ab_summary "$WORK/ab-put")"
    echo "$kind ab-put $rps" >>"$WORK/rates"
    row "| ${p}ab -k -c 1000 -n $AB_N GET put data= 512 B | $rps req/s ($(putpos abq) puts) | $p50 | $p99 | $cpu |"
    log "${p}ab gets"
    cpu=$(timed "$WORK/ab-get" ab -k -c 1000 -n "$AB_N" "$URL/?name=abq&opt=get")
    read -r rps p50 p99 <<<"$(ab_summary "$WORK/ab-get")"
    echo "$kind ab-get $rps" >>"$WORK/rates"
    row "| ${p}ab -k -c 1000 -n $AB_N GET get | $rps req/s ($(getpos abq) got) | $p50 | $p99 | $cpu |"
}
if [ -n "$HTTPMQ" ]; then
    for round in $(seq "$VERSUS_ROUNDS"); do
        for kind in httpmq warren; do
            start_server "$kind"
            http_rows "versus round $round: $kind, " "$kind"
            stop_broker
        done
    done
    URL="http://127.0.0.1:$HTTP_PORT"
    median() { sort -n | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
    for w in wrk-put wrk-get ab-put ab-get; do
        h=$(awk -v w="$w" '$1 == "httpmq" && $2 == w {print $3}' "$WORK/rates" | median)
        x=$(awk -v w="$w" '$1 == "warren" && $2 == w {print $3}' "$WORK/rates" | median)
        row "| versus, median of $VERSUS_ROUNDS rounds: $w | Warren $x / httpmq $h = $(awk -v x="$x" -v h="$h" 'BEGIN {printf "%.2fx", (h > 0) ? x / h : 0}') | | | |"
        # Against the floor: how much of the most this HTTP stack can answer on this machine
        # Warren reaches, and how much twice httpmq would take.
        f=$(awk -v w="$w" '$1 == "floor" && $2 == w {print $3}' "$WORK/rates" | median)
        if [ -n "$f" ]; then
            row "| floor, median of $FLOOR_ROUNDS rounds: $w | floor $f req/s: Warren $(awk -v x="$x" -v f="$f" 'BEGIN {printf "%d%%", 100 * x / f}') of it, twice httpmq $(awk -v h="$h" -v f="$f" 'BEGIN {printf "%d%%", 200 * h / f}') of it | | | |"
        fi
    done
fi
if [ -n "$SKIP_MAIN" ]; then
    printf '\n| workload | rate | p50 | p99 | CPU broker / load tool (%% of one core) (machine %%) |\n|---|---:|---:|---:|---:|\n'
    cat "$RESULTS"
    exit 0
fi

start_broker
http_rows "" warren

amqp_rows() { # label
    for spec in "1p/1c transient:--producers 1 --consumers 1 --prefetch 100" \
        "1p/1c persistent+confirms(100):--producers 1 --consumers 1 --prefetch 100 --persistent --confirm 100"; do
        name=${spec%%:*}; args=${spec#*:}
        # shellcheck disable=SC2086
        line=$("$PERF" --uri "amqp://guest:guest@127.0.0.1:$WARREN_PORT/%2f" $args --duration "$DURATION" --json 2>/dev/null | grep '^{' | tail -1)
        row "| AMQP $name (warren-perf)$1 | $(jq -r '.consume_rate_median' <<<"$line") msg/s, missing/dup $(jq -r '"\(.missing)/\(.duplicates)"' <<<"$line") | $(jq -r '.latency_p50_us' <<<"$line") µs | $(jq -r '.latency_p99_us' <<<"$line") µs | - |"
    done
}
log "AMQP (warren-perf)"
amqp_rows ""
row "| broker peak RSS (VmHWM) | $(rss_peak_mb) MB | | | |"
stop_broker

if [ -n "$BASELINE_WARREN" ]; then
    for round in 1 2; do
        log "AMQP round $round: baseline, then this build"
        start_broker "$BASELINE_WARREN"; amqp_rows " baseline, round $round"; stop_broker
        start_broker; amqp_rows " this build, round $round"; stop_broker
    done
fi

if [ -z "$SKIP_BACKLOG" ]; then
    log "backlog: $BACKLOG_N x 1 KiB"
    start_broker
    head -c 1024 /dev/zero | tr '\0' 'y' >"$WORK/1k"
    cpu=$(timed "$WORK/bl-put" ab -k -c 100 -n "$BACKLOG_N" -p "$WORK/1k" -T application/octet-stream "$URL/?name=backlog&opt=put")
    read -r rps p50 p99 <<<"$(ab_summary "$WORK/bl-put")"
    row "| backlog fill ab -k -c 100 POST put 1 KiB | $rps req/s ($(putpos backlog) puts), peak RSS $(rss_peak_mb) MB | $p50 | $p99 | $cpu |"
    cpu=$(timed "$WORK/bl-get" ab -k -c 100 -n "$BACKLOG_N" "$URL/?name=backlog&opt=get")
    read -r rps p50 p99 <<<"$(ab_summary "$WORK/bl-get")"
    row "| backlog drain ab -k -c 100 GET get | $rps req/s ($(getpos backlog) got, $(unread backlog) left), peak RSS $(rss_peak_mb) MB | $p50 | $p99 | $cpu |"
    du -sh "$WORK/data" | awk '{print "data directory after the drain: " $1}' | tee -a "$RESULTS"
    stop_broker
fi

echo
echo "| workload | rate | p50 | p99 | CPU broker / load tool (% of one core) (machine %) |"
echo "|---|---:|---:|---:|---:|"
cat "$RESULTS"
