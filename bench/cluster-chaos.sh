#!/usr/bin/env bash
# Fault injection on a 3-node Warren cluster on loopback: publishers with confirms and
# consumers run against quorum queues while nodes are killed with SIGKILL (and restarted) or
# paused with SIGSTOP (and resumed); at the end every confirmed message must have been
# consumed, and a message delivered twice must carry the redelivered flag the second time.
#
#   bench/cluster-chaos.sh                          # 60 s, 2 queues, a fault every ~5 s
#   DURATION=600 SEED=7 bench/cluster-chaos.sh      # 10 minutes, a reproducible schedule
#
# Settings (environment):
#   DURATION      seconds of publishing under faults (default 60)
#   QUEUES        quorum queues, one publisher each (default 2)
#   WARREN        the warren binary (default target/release/warren)
#   SEED          seed of the fault schedule (default: random, printed)
#   FAULT_EVERY   mean seconds between faults (default 5)
#   RATE          publishes per second per publisher, 0 = as fast as confirms allow (default 500)
#   WINDOW        unconfirmed publishes per publisher (default 100)
#   CONSUMERS     consumers per queue per node (default 1)
#   SETTLE        seconds to wait after the last fault before draining (default 10)
#   KEEP          1 keeps the data directories too (default: only the logs are kept)
#   GROUP_SIZE    x-quorum-initial-group-size of the queues (default: every node); with 2,
#                 the third node's clients reach each queue through the members' nodes
#
# Needs python3 with pika (pip install pika). The node logs, the fault log and the raw
# delivery records stay in the temporary directory printed at the start; the summary goes to
# bench/results/cluster-chaos-<timestamp>.md. Exit status: 0 when nothing confirmed was lost
# and no duplicate came without redelivered, 1 when something was, 2 on a set-up error.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DURATION=${DURATION:-60}
QUEUES=${QUEUES:-2}
WARREN=${WARREN:-$ROOT/target/release/warren}
SEED=${SEED:-$RANDOM$RANDOM}
FAULT_EVERY=${FAULT_EVERY:-5}
RATE=${RATE:-500}
WINDOW=${WINDOW:-100}
CONSUMERS=${CONSUMERS:-1}
SETTLE=${SETTLE:-10}
KEEP=${KEEP:-0}
GROUP_SIZE=${GROUP_SIZE:-0}
export DURATION QUEUES SEED FAULT_EVERY RATE WINDOW CONSUMERS SETTLE GROUP_SIZE

log() { echo "[cluster-chaos $(date -u +%H:%M:%S)] $*" >&2; }

[ -x "$WARREN" ] || { log "no warren binary at $WARREN (set WARREN)"; exit 2; }
python3 -c 'import pika' 2>/dev/null || { log "python3 needs pika: pip install pika"; exit 2; }
case "$WARREN" in /*) ;; *) WARREN=$(pwd)/$WARREN ;; esac

DIR=$(mktemp -d "${TMPDIR:-/tmp}/warren-chaos.XXXXXX")
log "working directory (node logs, fault log, records): $DIR"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$DIR/secret"
echo >> "$DIR/secret"

# Twelve distinct free ports: cluster, AMQP, management and httpmq for each node.
read -r -a PORTS <<< "$(python3 - <<'EOF'
import socket
socks = []
for _ in range(12):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)"
SEEDS="1@127.0.0.1:${PORTS[0]},2@127.0.0.1:${PORTS[1]},3@127.0.0.1:${PORTS[2]}"
: > "$DIR/nodes"
for i in 1 2 3; do
    cport=${PORTS[$((i - 1))]}
    amqp=${PORTS[$((i + 2))]}
    mgmt=${PORTS[$((i + 5))]}
    httpmq=${PORTS[$((i + 8))]}
    mkdir -p "$DIR/node$i"
    echo "$i $amqp $mgmt $httpmq $cport" >> "$DIR/nodes"
done

# start-node.sh N runs node N in the foreground (exec), its log appended to nodeN.log; the
# fault loop uses it to restart a killed node. The broker refuses WARREN_* variables it does
# not know, so none of the caller's are passed on.
cat > "$DIR/start-node.sh" <<EOF
#!/usr/bin/env bash
set -eu
i=\$1
read -r _ amqp mgmt httpmq cport < <(awk -v i="\$i" '\$1 == i' "$DIR/nodes")
for v in \$(compgen -e); do case "\$v" in WARREN_*) unset "\$v" ;; esac; done
echo "=== start \$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)" >> "$DIR/node\$i.log"
export WARREN_CLUSTER_NODE_ID=\$i WARREN_CLUSTER_LISTEN=127.0.0.1:\$cport
export WARREN_CLUSTER_SEED_NODES=$SEEDS WARREN_CLUSTER_SECRET_FILE=$DIR/secret
exec "$WARREN" --amqp-listen 127.0.0.1:\$amqp --management-listen 127.0.0.1:\$mgmt \\
    --httpmq-listen 127.0.0.1:\$httpmq --data-dir "$DIR/node\$i" --log-level info \\
    >> "$DIR/node\$i.log" 2>&1
EOF
chmod +x "$DIR/start-node.sh"

PY_PID=""
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$PY_PID" ] && kill -0 "$PY_PID" 2>/dev/null; then
        kill "$PY_PID" 2>/dev/null || true
        sleep 1
        kill -9 "$PY_PID" 2>/dev/null || true
    fi
    # nodeN.pid always names the node's current process (the fault loop rewrites it on a
    # restart); a paused node is resumed first so that it is not left stopped.
    for i in 1 2 3; do
        [ -f "$DIR/node$i.pid" ] || continue
        pid=$(cat "$DIR/node$i.pid")
        kill -CONT "$pid" 2>/dev/null || true
        kill -9 "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    if [ "$KEEP" != 1 ]; then
        rm -rf "$DIR/node1" "$DIR/node2" "$DIR/node3"
    fi
    log "logs kept in $DIR"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for i in 1 2 3; do
    "$DIR/start-node.sh" "$i" &
    echo $! > "$DIR/node$i.pid"
    disown  # no "Killed" notice from bash when the fault loop kills it
done
for i in 1 2 3; do
    amqp=${PORTS[$((i + 2))]}
    for _ in $(seq 300); do
        (echo > "/dev/tcp/127.0.0.1/$amqp") 2>/dev/null && break
        kill -0 "$(cat "$DIR/node$i.pid")" 2>/dev/null || { log "node $i exited:"; tail -20 "$DIR/node$i.log"; exit 2; }
        sleep 0.1
    done
    (echo > "/dev/tcp/127.0.0.1/$amqp") 2>/dev/null || { log "node $i does not listen"; exit 2; }
done
log "3 nodes up (AMQP ports ${PORTS[3]} ${PORTS[4]} ${PORTS[5]}), seed $SEED"

STAMP=$(date -u +%Y-%m-%dT%H%M%S)
mkdir -p "$ROOT/bench/results"
RESULTS="$ROOT/bench/results/cluster-chaos-$STAMP.md"
set +e
python3 "$ROOT/bench/cluster_chaos.py" "$DIR" "$RESULTS" &
PY_PID=$!
wait "$PY_PID"
status=$?
PY_PID=""
set -e
exit "$status"
