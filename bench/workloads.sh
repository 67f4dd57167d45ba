# The workloads of bench/compare.sh, shared with bench/versus.sh: for each workload name,
# DESC[name] (the table row's label), ARGS[name] (warren-perf's arguments, without --uri,
# --duration, --broker-pid and --json) and KIND[name] (empty for the classic rows a-h, "latency"
# for the m rows, "scale" or "relay" for the scale and ceiling rows).
# Source it at the top level of a bash script (declare -A inside a function would make the
# tables local). The sizes below can be set in the environment.
# shellcheck shell=bash disable=SC2034 # the tables are used by the scripts that source this
IDLE_CONNS=${IDLE_CONNS:-1000}
CHURN_CLIENTS=${CHURN_CLIENTS:-8}
MANY_QUEUES=${MANY_QUEUES:-100000}
MANY_CONNS=${MANY_CONNS:-10000}
RECOVERY_MSGS=${RECOVERY_MSGS:-1000000}
RECOVERY_QUEUES=${RECOVERY_QUEUES:-10}
RAW_CONFIRM=${RAW_CONFIRM:-5000}
REST_SECS=${REST_SECS:-10}

# Classic workloads (a-h, m*): warren-perf on amqprs, one table row each.
declare -A DESC ARGS KIND
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
for r in 10 30 50; do
    DESC[m$r]="(m) fixed ${r}k msg/s 1p/1c 1 KB transient: p50/p99/p99.9 µs"
    ARGS[m$r]="--producers 1 --consumers 1 --prefetch 100 --rate ${r}000"
    KIND[m$r]=latency
done
# Scale and ceiling workloads: their own modes of warren-perf.
DESC[i]="(i) connection churn, $CHURN_CLIENTS clients: cycles/s"
ARGS[i]="--mode churn --clients $CHURN_CLIENTS"
DESC[j]="(j) $MANY_QUEUES durable queues + topic bindings, 16 connections: declares/s"
ARGS[j]="--mode many-queues --queues $MANY_QUEUES --parallel 16 --rest $REST_SECS"
DESC[k]="(k) $MANY_CONNS connections, 1 msg/s each: p99 latency µs"
ARGS[k]="--mode many-connections --connections $MANY_CONNS --conn-rate 1 --warmup 3"
DESC[l]="(l) recovery after kill -9, $RECOVERY_MSGS x 1 KB persistent in $RECOVERY_QUEUES queues: ms to first basic.get"
ARGS[l]="--mode recovery-fill --queues $RECOVERY_QUEUES --messages $RECOVERY_MSGS --confirm $RAW_CONFIRM"
DESC[rt]="raw frames 1p/1c transient 1 KB, multi-ack 100: deliveries/s"
ARGS[rt]="--mode raw --prefetch 1000 --multi-ack 100"
DESC[rp]="raw frames 1p/1c persistent+confirms($RAW_CONFIRM) 1 KB: deliveries/s"
ARGS[rp]="--mode raw --prefetch 1000 --multi-ack 100 --persistent --confirm $RAW_CONFIRM"
DESC[rf]="raw frames fanout 1p to 4 queues, 1 consumer connection: deliveries/s"
ARGS[rf]="--mode raw --prefetch 1000 --multi-ack 100 --exchange-type fanout --queues 4"
DESC[relay]="copy-only TCP relay, 64 KB reads/writes, raw 1 KB frames: msg/s"
ARGS[relay]="--mode raw --relay"
for w in i j k l rt rp rf; do KIND[$w]=scale; done
KIND[relay]=relay
