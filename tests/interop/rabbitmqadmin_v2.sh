#!/usr/bin/env bash
# The Rust rabbitmqadmin v2 (github.com/rabbitmq/rabbitmqadmin-ng, `cargo install
# rabbitmqadmin`) run unchanged against a broker's management HTTP API. Optional: when the
# tool is not installed the suite says so and passes (it is never installed from here:
# building it takes minutes).
#
# Usage: bash tests/interop/rabbitmqadmin_v2.sh
#
# Environment:
#   MGMT_PORT          management API port on 127.0.0.1 (default 15672)
#   MGMT_USER          user (default guest), MGMT_PASSWORD (default guest)
#   AMQP_URL           an AMQP URL of the same broker: with pika, a client holds a connection
#                      open to list and close it (skipped without)
#   RABBITMQADMIN_V2   the tool (default: a `rabbitmqadmin` on PATH or in ~/.cargo/bin whose
#                      `--version` says 2.x; the Python rabbitmqadmin of the same name is
#                      passed over)
set -uo pipefail

PORT=${MGMT_PORT:-15672}
USER_=${MGMT_USER:-guest}
PASS=${MGMT_PASSWORD:-guest}

is_v2() { [ -x "$1" ] && "$1" --version 2>/dev/null | grep -Eq '^rabbitmqadmin 2\.'; }

tool=${RABBITMQADMIN_V2:-}
if [ -z "$tool" ]; then
  while IFS= read -r candidate; do
    if is_v2 "$candidate"; then
      tool=$candidate
      break
    fi
  done < <(type -ap rabbitmqadmin; echo "$HOME/.cargo/bin/rabbitmqadmin")
fi
if [ -z "$tool" ] || ! is_v2 "$tool"; then
  echo "skip: rabbitmqadmin v2 is not installed (cargo install rabbitmqadmin)"
  exit 0
fi
echo "rabbitmqadmin v2: $tool ($("$tool" --version))"

# admin [as USER PASSWORD] ARGS...
admin() {
  local user=$USER_ pass=$PASS
  if [ "${1:-}" = as ]; then
    user=$2 pass=$3
    shift 3
  fi
  "$tool" --host 127.0.0.1 --port "$PORT" --username "$user" --password "$pass" \
    --non-interactive "$@"
}

passed=0
failed=0
OUT=""

# run NAME EXPECTED_REGEX ARGS...: runs the tool with ARGS, expects exit 0 and output
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

# refuse NAME EXPECTED_REGEX ARGS...: expects a non-zero exit and output matching.
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

# absent NAME REGEX ARGS...: expects exit 0 and no output line matching REGEX.
absent() {
  local name=$1 unwanted=$2
  shift 2
  local status=0
  OUT=$(admin "$@" 2>&1) || status=$?
  if [ "$status" -eq 0 ] && ! printf '%s\n' "$OUT" | grep -Eq -- "$unwanted"; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name (exit $status): rabbitmqadmin $*"
    printf '%s\n' "$OUT" | sed 's/^/     | /'
  fi
}

q=radmin2-q-$$
x=radmin2-x-$$
p=radmin2-p-$$
v=radmin2-v-$$
u=radmin2-u-$$

run "show overview" "RabbitMQ version" show overview
run "show churn" "Queues and streams created" show churn
run "list nodes" "@" list nodes
run "list vhosts" "^/ " list vhosts
run "list users" "^$USER_ " list users
run "list permissions" "^$USER_ +/ " list permissions
run "list exchanges" "^amq\.topic +/ +topic" list exchanges
run "list feature flags" "^" list feature_flags
run "list deprecated features" "^" list deprecated_features
run "health check: local alarms" "passed" health_check local_alarms
run "health check: cluster-wide alarms" "passed" health_check cluster_wide_alarms
run "health check: quorum critical" "passed" health_check node_is_quorum_critical
refuse "health check: no STOMP listener" "No active listener" \
  health_check protocol_listener --protocol stomp

run "declare queue" "^" declare queue --name "$q" --durable true
run "declare exchange" "^" declare exchange --name "$x" --type topic
run "declare binding" "^" declare binding --source "$x" --destination-type queue \
  --destination "$q" --routing-key 'k.*'
run "list queues" "^$q +/ +classic +true" list queues
run "list bindings" "^/ +$x +$q +queue +k\.\*" list bindings
run "publish routed" "routed successfully" publish message -e "$x" -k k.one -m hello
run "publish again" "routed successfully" publish message -e "$x" -k k.two -m again
run "get with requeue" "k\.one +1 +hello" get messages -q "$q" -c 1 -a ack_requeue_true
run "get with ack" "k\.one +1 +hello" get messages -q "$q" -c 1 -a ack_requeue_false
run "purge" "^" purge queue --name "$q"
run "get from the purged queue" "^$" get messages -q "$q" -c 1 -a ack_requeue_false

run "declare policy" "^" declare policy --name "$p" --pattern "^$q\$" --apply-to queues \
  --definition '{"max-length": 5}' --priority 3
run "list policies" "^$p +/ +\^$q" list policies
run "declare policy for classic queues (4.x apply-to)" "^" declare policy --name "$p-cq" \
  --pattern "^none\$" --apply-to classic_queues --definition '{"max-length": 5}'
run "delete that policy" "^" delete policy --name "$p-cq"

run "declare vhost" "^" declare vhost --name "$v"
run "declare user" "^" declare user --name "$u" --password radmin2-pw --tags management
run "declare permissions" "^" declare permissions --vhost "$v" --user "$u" \
  --configure '.*' --write '.*' --read '.*'
run "list permissions shows them" "^$u +$v " list permissions
run "declare vhost limit" "^" declare vhost_limit --vhost "$v" --name max-queues --value 10
run "list vhost limits" "^$v +max-queues: 10" list vhost_limits --vhost "$v"
run "declare user limit" "^" declare user_limit --user "$u" --name max-connections --value 3
run "list user limits" "^$u +max-connections: 3" list user_limits
run "delete user limit" "^" delete user_limit --user "$u" --name max-connections
run "the new user sees its vhost" "^$v " as "$u" radmin2-pw list vhosts
absent "and not the others" "^/ " as "$u" radmin2-pw list vhosts
refuse "nor the queues of /" "User not authorised to access virtual host" \
  as "$u" radmin2-pw list queues

export_file=$(mktemp -t radmin2-export.XXXXXX)
run "export" "^" definitions export --file "$export_file"
if python3 - "$export_file" "$q" "$x" "$p" "$v" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert any(q["name"] == sys.argv[2] and q["durable"] for q in d["queues"]), d["queues"]
assert any(x["name"] == sys.argv[3] and x["type"] == "topic" for x in d["exchanges"]), d["exchanges"]
assert any(b["source"] == sys.argv[3] and b["destination"] == sys.argv[2] for b in d["bindings"])
assert any(p["name"] == sys.argv[4] for p in d["policies"]), d["policies"]
assert any(v["name"] == sys.argv[5] for v in d["vhosts"]), d["vhosts"]
PY
then
  passed=$((passed + 1)); echo "ok   export holds the queue, exchange, binding, policy and vhost"
else
  failed=$((failed + 1)); echo "FAIL export holds the queue, exchange, binding, policy and vhost"
fi
run "delete binding" "^" delete binding --source "$x" --destination-type queue \
  --destination "$q" --routing-key 'k.*'
run "delete queue" "^" delete queue --name "$q"
run "delete exchange" "^" delete exchange --name "$x"
run "delete policy" "^" delete policy --name "$p"
absent "queue gone" "^$q " list queues
run "import" "^" definitions import --file "$export_file"
run "import brought the queue back" "^$q +/ " list queues
run "import brought the binding back" "^/ +$x +$q +queue +k\.\*" list bindings
run "import brought the policy back" "^$p " list policies
rm -f "$export_file"

# Connections, channels and consumers: a pika client holds a connection with a consumer
# open while they are listed, then it is closed over HTTP and the client sees 320
# CONNECTION_FORCED.
if [ -n "${AMQP_URL:-}" ] && python3 -c 'import pika' 2>/dev/null; then
  holder_out=$(mktemp -t radmin2-holder.XXXXXX)
  python3 - "$AMQP_URL" <<'PY' >"$holder_out" 2>&1 &
import sys, time
import pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
ch.queue_declare("radmin2-consumed", auto_delete=True)
ch.basic_consume("radmin2-consumed", lambda *a: None, consumer_tag="radmin2-consumer")
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
  run "list connections" " -> .* AMQP 0-9-1 +$USER_ " list connections
  run "list channels" "\(1\) +/ +running" list channels
  run "list connections of the user" " -> " list user_connections --username "$USER_"
  # The last column is the delivery acknowledgement timeout, RabbitMQ's default 30 minutes.
  run "list consumers" "^/ +radmin2-consumed +radmin2-consumer +true .* 1800000 *$" \
    list consumers
  conn_name=$(admin list connections | grep -Eo '^[^ ]+ -> [^ ]+' | head -n 1)
  run "close connection" "^" close connection --name "$conn_name"
  wait "$holder"
  if grep -q "closed 320 CONNECTION_FORCED" "$holder_out"; then
    passed=$((passed + 1)); echo "ok   the client got 320 CONNECTION_FORCED"
  else
    failed=$((failed + 1)); echo "FAIL the client did not get 320 CONNECTION_FORCED:"
    sed 's/^/     | /' "$holder_out"
  fi
  rm -f "$holder_out"
else
  echo "skip connections, channels and consumers: no AMQP_URL or no pika"
fi

run "delete queue" "^" delete queue --name "$q"
run "delete exchange" "^" delete exchange --name "$x"
run "delete policy" "^" delete policy --name "$p"
run "delete user" "^" delete user --name "$u"
refuse "deleted user is refused" "Not_Authorized" \
  as "$u" radmin2-pw list vhosts
run "delete vhost" "^" delete vhost --name "$v"
refuse "bad credentials" "Not_Authorized" as nobody wrong list queues

echo "rabbitmqadmin v2: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
