#!/usr/bin/env bash
# RabbitMQ's own command-line tool, rabbitmqadmin (the Python script Debian's rabbitmq-server
# package ships), run unchanged against a broker's management HTTP API.
#
# Usage: bash tests/interop/rabbitmqadmin.sh
#
# Environment:
#   MGMT_PORT       management API port on 127.0.0.1 (default 15672)
#   MGMT_USER       user (default guest), MGMT_PASSWORD (default guest)
#   WARREN_BIN      a Warren binary: the export is imported into a fresh Warren started from
#                   it (skipped without it)
#   RABBITMQADMIN   the tool (default: the Python rabbitmqadmin on PATH; otherwise it is
#                   extracted from Debian's rabbitmq-server package without installing or
#                   starting RabbitMQ)
set -uo pipefail

PORT=${MGMT_PORT:-15672}
USER_=${MGMT_USER:-guest}
PASS=${MGMT_PASSWORD:-guest}

# is_python_tool FILE: true when FILE is the Python rabbitmqadmin script. The Rust
# rabbitmqadmin v2 (`cargo install rabbitmqadmin`, ~/.cargo/bin) has the same name but other
# commands and flags, so a binary of that name on PATH is passed over.
is_python_tool() {
  [ -f "$1" ] && head -c 2 "$1" | grep -q '^#!' && head -n 1 "$1" | grep -q python
}

tool=${RABBITMQADMIN:-}
if [ -z "$tool" ]; then
  path_tool=""
  while IFS= read -r candidate; do
    if is_python_tool "$candidate"; then
      path_tool=$candidate
      break
    fi
    echo "passing over $candidate: not the Python rabbitmqadmin script"
  done < <(type -ap rabbitmqadmin)
  if [ -n "$path_tool" ]; then
    tool=$path_tool
  else
    dir=$(mktemp -d -t rabbitmqadmin.XXXXXX)
    echo "extracting rabbitmqadmin from Debian's rabbitmq-server package into $dir"
    (cd "$dir" && apt-get download rabbitmq-server >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get download rabbitmq-server >/dev/null; })
    dpkg -x "$dir"/rabbitmq-server_*.deb "$dir/root"
    tool=$(find "$dir/root" -name rabbitmqadmin -type f | head -n 1)
    if [ -z "$tool" ]; then
      echo "error: rabbitmqadmin not found in the rabbitmq-server package" >&2
      exit 1
    fi
  fi
fi
echo "rabbitmqadmin: $tool"

admin() { python3 "$tool" -H 127.0.0.1 -P "$PORT" -u "$USER_" -p "$PASS" "$@"; }

passed=0
failed=0
OUT=""

# run NAME EXPECTED_REGEX ARGS...: runs rabbitmqadmin ARGS, expects exit 0 and output
# matching EXPECTED_REGEX.
run() {
  local name=$1 want=$2
  shift 2
  local status=0
  OUT=$(admin "$@" 2>&1) || status=$?
  if [ "$status" -eq 0 ] && printf '%s\n' "$OUT" | grep -Eq -- "$want"; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (exit $status): rabbitmqadmin $*"
    printf '%s\n' "$OUT" | sed 's/^/     | /'
  fi
}

# refuse NAME EXPECTED_REGEX ARGS...: expects a non-zero exit and the server's reason.
refuse() {
  local name=$1 want=$2
  shift 2
  local status=0
  OUT=$(admin "$@" 2>&1) || status=$?
  if [ "$status" -ne 0 ] && printf '%s\n' "$OUT" | grep -Eq -- "$want"; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (exit $status, expected a refusal): rabbitmqadmin $*"
    printf '%s\n' "$OUT" | sed 's/^/     | /'
  fi
}

q=radmin-q-$$
x=radmin-x-$$

run "show overview" "rabbitmq_version" show overview
run "list vhosts" "\| / " list vhosts
run "list users" "\| $USER_ " list users
run "declare queue" "queue declared" declare queue name="$q" durable=true
run "declare queue again (equivalent)" "queue declared" declare queue name="$q" durable=true
refuse "declare queue inequivalent" "inequivalent arg 'durable'" declare queue name="$q" durable=false
run "declare exchange" "exchange declared" declare exchange name="$x" type=topic
run "declare binding" "binding declared" declare binding source="$x" destination="$q" routing_key="k.*"
run "list queues" "\| $q " list queues
run "list exchanges" "\| $x +\| topic" list exchanges name type
run "list bindings" "\| $x +\| $q +\| k\.\* " list bindings source destination routing_key
run "publish routed" "Message published$" publish exchange="$x" routing_key=k.one payload=hello
run "publish unroutable" "but NOT routed" publish exchange="$x" routing_key=nowhere payload=lost
run "list queues shows depth" "\| $q +\| 1 " list queues name messages
run "get with requeue" "\| k\.one +\| $x +\| 0 +\| hello " get queue="$q" ackmode=ack_requeue_true
run "message still there" "\| $q +\| 1 " list queues name messages
run "get with ack" "\| hello " get queue="$q" ackmode=ack_requeue_false
run "queue empty after ack" "\| $q +\| 0 " list queues name messages
run "publish again" "Message published" publish exchange="$x" routing_key=k.two payload=again
run "purge" "queue purged" purge queue name="$q"
run "queue empty after purge" "\| $q +\| 0 " list queues name messages
p=radmin-p-$$
run "declare policy" "policy declared" declare policy name="$p" pattern="^$q\$" \
  definition='{"max-length": 1}' apply-to=queues priority=3
run "list policies" "\| $p +\| \^$q" list policies name pattern
run "declare operator policy" "operator_policy declared" declare operator_policy name="$p-op" \
  pattern="^$q\$" definition='{"max-length": 5}'
run "list operator policies" "\| $p-op " list operator_policies name
refuse "declare policy with an unknown key" "not recognised policy settings" \
  declare policy name="$p-bad" pattern=. definition='{"no-such-key": 1}'
# (JSON: rabbitmqadmin's table and tsv output fail on the null policy of any queue without
# one, on RabbitMQ as on Warren.)
run "policy applies to the queue" "\\{\"name\":\"$q\",\"operator_policy\":\"$p-op\",\"policy\":\"$p\"\\}" \
  -f raw_json list queues name policy operator_policy
run "publish twice" "Message published" publish exchange="$x" routing_key=k.a payload=first
run "publish twice" "Message published" publish exchange="$x" routing_key=k.b payload=second
run "max-length 1 kept the newest" "\| $q +\| 1 " list queues name messages
run "get the newest" "\| second " get queue="$q" ackmode=ack_requeue_false
export_file=$(mktemp -t radmin-export.XXXXXX)
run "export" "Exported definitions" export "$export_file"
if python3 - "$export_file" "$q" "$x" "$p" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert any(q["name"] == sys.argv[2] and q["durable"] for q in d["queues"]), d["queues"]
assert any(x["name"] == sys.argv[3] and x["type"] == "topic" for x in d["exchanges"]), d["exchanges"]
assert any(b["source"] == sys.argv[3] and b["destination"] == sys.argv[2] for b in d["bindings"])
assert d["vhosts"] and d["users"]
assert any(p["name"] == sys.argv[4] and p["definition"] == {"max-length": 1} for p in d["policies"]), d["policies"]
PY
then
  passed=$((passed + 1)); echo "ok   export holds the queue, exchange, binding and policy"
else
  failed=$((failed + 1)); echo "FAIL export holds the queue, exchange, binding and policy"
fi
# Import into a fresh Warren (WARREN_BIN, exported by run.sh when it starts Warren): the
# export, imported twice (idempotent), exports again the same.
if [ -n "${WARREN_BIN:-}" ] && [ -x "$WARREN_BIN" ]; then
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
  fresh_amqp=$(free_port)
  fresh_mgmt=$(free_port)
  fresh_dir=$(mktemp -d -t radmin-fresh.XXXXXX)
  "$WARREN_BIN" --amqp-listen "127.0.0.1:$fresh_amqp" --management-listen "127.0.0.1:$fresh_mgmt" \
    --httpmq-listen 127.0.0.1:0 --data-dir "$fresh_dir/data" --log-level warn >"$fresh_dir/log" 2>&1 &
  fresh_pid=$!
  for _ in $(seq 1 150); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $fresh_mgmt), timeout=1).close()" \
      2>/dev/null && break
    sleep 0.2
  done
  fresh() { python3 "$tool" -H 127.0.0.1 -P "$fresh_mgmt" -u guest -p guest "$@"; }
  reexport="$fresh_dir/reexport.json"
  status=0
  import_out=$(fresh import "$export_file" 2>&1 && fresh import "$export_file" 2>&1 \
    && fresh export "$reexport" 2>&1) || status=$?
  if [ "$status" -eq 0 ] && python3 - "$export_file" "$reexport" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
def items(d, k, strip=()):
    return sorted(json.dumps({f: v for f, v in o.items() if f not in strip}, sort_keys=True)
                  for o in d.get(k, []))
for k in ["queues", "exchanges", "bindings", "policies", "permissions", "topic_permissions"]:
    assert items(a, k) == items(b, k), (k, items(a, k), items(b, k))
for k in ["users", "vhosts"]:
    assert sorted(o["name"] for o in a[k]) == sorted(o["name"] for o in b[k]), k
PY
  then
    passed=$((passed + 1)); echo "ok   import into a fresh Warren (twice) exports the same definitions"
  else
    failed=$((failed + 1)); echo "FAIL import into a fresh Warren (exit $status)"
    printf '%s\n' "$import_out" | sed 's/^/     | /'
    tail -n 50 "$fresh_dir/log" | sed 's/^/     log | /'
  fi
  kill "$fresh_pid" 2>/dev/null
  wait "$fresh_pid" 2>/dev/null
  rm -rf "$fresh_dir"
else
  echo "skip import into a fresh Warren: no WARREN_BIN"
fi
rm -f "$export_file"
run "delete policy" "policy deleted" delete policy name="$p"
run "delete operator policy" "operator_policy deleted" delete operator_policy name="$p-op"
run "policies gone" "^" list policies name
if printf '%s\n' "$OUT" | grep -q -- "$p"; then
  failed=$((failed + 1)); echo "FAIL policy still listed after delete"
fi
run "delete queue" "queue deleted" delete queue name="$q"
run "delete exchange" "exchange deleted" delete exchange name="$x"
run "queue gone" "^" list queues name
if printf '%s\n' "$OUT" | grep -q -- "$q"; then
  failed=$((failed + 1)); echo "FAIL queue still listed after delete"
fi
refuse "bad credentials" "Access refused|401|not_authorized|Not_Authorized" -u nobody -p wrong list queues

# Vhosts, users and permissions at run time.
v=radmin-v-$$
u=radmin-u-$$
run "declare vhost" "vhost declared" declare vhost name="$v"
run "list vhosts shows it" "\| $v " list vhosts name
run "declare user" "user declared" declare user name="$u" password=radmin-pw tags=management
run "list users shows it" "\| $u +\| management " list users name tags
run "declare permission" "permission declared" declare permission vhost="$v" user="$u" configure=".*" write=".*" read="^radmin"
run "list permissions shows it" "\| $u +\| $v +\| \^radmin " list permissions user vhost read
run "new user logs in over HTTP" "\| $v " -u "$u" -p radmin-pw list vhosts name
run "delete permission" "permission deleted" delete permission vhost="$v" user="$u"
run "delete user" "user deleted" delete user name="$u"
refuse "deleted user is refused" "Access refused|401|not_authorized|Not_Authorized" -u "$u" -p radmin-pw list vhosts
run "delete vhost" "vhost deleted" delete vhost name="$v"

# Connections and channels: a pika client holds a connection (with a consumer) open while
# they are listed, then it is closed over HTTP and the client sees 320 CONNECTION_FORCED.
if [ -n "${AMQP_URL:-}" ] && python3 -c 'import pika' 2>/dev/null; then
  holder_out=$(mktemp -t radmin-holder.XXXXXX)
  python3 - "$AMQP_URL" "$q-c" >"$holder_out" 2>&1 <<'PY' &
import sys, time
import pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
ch.queue_declare(sys.argv[2], auto_delete=True)
ch.basic_consume(sys.argv[2], lambda *a: None, consumer_tag="radmin-consumer")
print("open", flush=True)
try:
    deadline = time.time() + 60
    while time.time() < deadline:
        conn.process_data_events(time_limit=0.2)
    print("still open after 60 s", flush=True)
except pika.exceptions.ConnectionClosedByBroker as e:
    print(f"closed {e.reply_code} {e.reply_text}", flush=True)
PY
  holder=$!
  for _ in $(seq 1 100); do grep -q open "$holder_out" && break; sleep 0.1; done
  run "list connections" "\| [0-9a-f.:]+:[0-9]+ -> [0-9a-f.:]+:[0-9]+ +\| [^ ]+ +\| 1 " list connections name user channels
  run "list channels" " \(1\) +\| " list channels name user
  run "list consumers" "radmin-consumer" list consumers consumer_tag
  conn_name=$(admin -f tsv -q list connections name | head -n 1)
  run "close connection" "connection closed" close connection name="$conn_name"
  wait "$holder"
  if grep -q "closed 320 CONNECTION_FORCED - Closed via management plugin" "$holder_out"; then
    passed=$((passed + 1)); echo "ok   the client got 320 CONNECTION_FORCED"
  else
    failed=$((failed + 1)); echo "FAIL the client did not get 320 CONNECTION_FORCED:"
    sed 's/^/     | /' "$holder_out"
  fi
  rm -f "$holder_out"
else
  echo "skip connections and channels: no AMQP_URL or no pika"
fi

echo "rabbitmqadmin: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
