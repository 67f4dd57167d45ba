#!/usr/bin/env bash
# Cross-language interop tests (Python/pika and Node/amqplib) against a Warren broker.
#
# Usage: bash tests/interop/run.sh          (from any directory)
#
# Environment:
#   AMQP_URL    if set, test against this broker instead of starting Warren
#               (e.g. amqp://guest:guest@127.0.0.1:5672/%2F for a real RabbitMQ)
#   WARREN_BIN  broker binary, relative to the repo root (default target/debug/warren); the
#               TLS tests start their own broker from it and are skipped without it
#   PORT        port for the started broker (default 5679, or a free port if busy)
#   MGMT_PORT   its management HTTP API port (default 15679, or a free port if busy); with
#               AMQP_URL set, the rabbitmqadmin suite runs only when MGMT_PORT is given
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$(pwd)

section() { printf '\n==== %s ====\n' "$*"; }

# ---------------------------------------------------------------------------
section "interop: dependencies"
# ---------------------------------------------------------------------------
if ! python3 -c 'import pika, pytest, pytest_timeout, amqp, cryptography' 2>/dev/null; then
  echo "installing Python test dependencies"
  python3 -m pip install -q -r tests/interop/python/requirements.txt \
    || python3 -m pip install -q --break-system-packages -r tests/interop/python/requirements.txt
fi
python3 -c 'import pika, pytest; print("pika", pika.__version__, "pytest", pytest.__version__)'

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "node/npm missing; installing with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q nodejs npm
fi
echo "node $(node --version), npm $(npm --version)"
if [ ! -f tests/interop/node/node_modules/amqplib/package.json ]; then
  echo "installing Node test dependencies (npm ci)"
  (cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error)
fi

# ---------------------------------------------------------------------------
# Broker
# ---------------------------------------------------------------------------
SERVER_PID=""
DATA_DIR=""
SERVER_LOG=""

cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  [ -n "$DATA_DIR" ] && rm -rf "$DATA_DIR"
  [ -n "$SERVER_LOG" ] && rm -f "$SERVER_LOG"
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_free() {
  python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
finally:
    s.close()
PY
}

port_open() {
  python3 - "$1" <<'PY'
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
except OSError:
    sys.exit(1)
PY
}

show_server_log() {
  if [ -n "$SERVER_LOG" ] && [ -f "$SERVER_LOG" ]; then
    echo "---- warren log (last 200 lines) ----"
    tail -n 200 "$SERVER_LOG" || true
    echo "---- end of warren log ----"
  fi
}

if [ -n "${AMQP_URL:-}" ]; then
  section "interop: using existing broker at AMQP_URL"
  echo "AMQP_URL=${AMQP_URL}"
else
  section "interop: starting warren"
  WARREN_BIN=${WARREN_BIN:-target/debug/warren}
  case "$WARREN_BIN" in /*) ;; *) WARREN_BIN="$ROOT/$WARREN_BIN" ;; esac
  # test_tls.py starts its own broker with a TLS listener from this binary.
  export WARREN_BIN
  if [ ! -x "$WARREN_BIN" ]; then
    echo "error: broker binary not found or not executable: $WARREN_BIN" >&2
    echo "build it with: cargo build -p warren-server --bin warren" >&2
    exit 1
  fi
  PORT=${PORT:-5679}
  if ! port_free "$PORT"; then
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
    echo "port in use; using free port $PORT"
  fi
  MGMT_PORT=${MGMT_PORT:-15679}
  if ! port_free "$MGMT_PORT"; then
    MGMT_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
    echo "management port in use; using free port $MGMT_PORT"
  fi
  export MGMT_PORT
  DATA_DIR=$(mktemp -d -t warren-interop-data.XXXXXX)
  SERVER_LOG=$(mktemp -t warren-interop-log.XXXXXX)
  "$WARREN_BIN" --amqp-listen "127.0.0.1:$PORT" --management-listen "127.0.0.1:$MGMT_PORT" --httpmq-listen 127.0.0.1:0 \
    --data-dir "$DATA_DIR" --log-level warn \
    >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  echo "warren pid $SERVER_PID on 127.0.0.1:$PORT (data dir $DATA_DIR)"
  deadline=$((SECONDS + 30))
  until port_open "$PORT"; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "error: warren exited before accepting connections" >&2
      show_server_log
      exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "error: warren did not accept connections on port $PORT within 30 s" >&2
      show_server_log
      exit 1
    fi
    sleep 0.2
  done
  echo "warren is accepting connections"
  export AMQP_URL="amqp://guest:guest@127.0.0.1:$PORT/%2F"
fi
export AMQP_URL

# ---------------------------------------------------------------------------
# Suites
# ---------------------------------------------------------------------------
py_status=0
node_status=0
admin_status=0
admin2_status=0

section "interop: python (pika)"
start=$SECONDS
python3 -m pytest -q tests/interop/python || py_status=$?
echo "python suite: exit $py_status in $((SECONDS - start)) s"

section "interop: node (amqplib)"
start=$SECONDS
npm test --silent --prefix tests/interop/node || node_status=$?
echo "node suite: exit $node_status in $((SECONDS - start)) s"

section "interop: rabbitmqadmin (management HTTP API)"
if [ -n "${MGMT_PORT:-}" ]; then
  start=$SECONDS
  bash tests/interop/rabbitmqadmin.sh || admin_status=$?
  echo "rabbitmqadmin suite: exit $admin_status in $((SECONDS - start)) s"
else
  echo "skipped: no MGMT_PORT for the broker at AMQP_URL"
fi

# Optional: passes with a note when the Rust rabbitmqadmin v2 is not installed (it is never
# installed from here).
section "interop: rabbitmqadmin v2 (management HTTP API)"
if [ -n "${MGMT_PORT:-}" ]; then
  start=$SECONDS
  bash tests/interop/rabbitmqadmin_v2.sh || admin2_status=$?
  echo "rabbitmqadmin v2 suite: exit $admin2_status in $((SECONDS - start)) s"
else
  echo "skipped: no MGMT_PORT for the broker at AMQP_URL"
fi

section "interop: summary"
echo "python (pika):   $([ "$py_status" -eq 0 ] && echo ok || echo "FAILED (exit $py_status)")"
echo "node (amqplib):  $([ "$node_status" -eq 0 ] && echo ok || echo "FAILED (exit $node_status)")"
echo "rabbitmqadmin:   $([ "$admin_status" -eq 0 ] && echo ok || echo "FAILED (exit $admin_status)")"
echo "rabbitmqadmin v2: $([ "$admin2_status" -eq 0 ] && echo "ok (or not installed)" || echo "FAILED (exit $admin2_status)")"

if [ "$py_status" -ne 0 ] || [ "$node_status" -ne 0 ] || [ "$admin_status" -ne 0 ] \
  || [ "$admin2_status" -ne 0 ]; then
  if [ -n "$SERVER_PID" ] && ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "warren is no longer running"
  fi
  show_server_log
  exit 1
fi
