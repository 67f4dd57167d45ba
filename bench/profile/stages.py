#!/usr/bin/env python3
"""Splits a folded profile (inferno-collapse-perf output) into the stages of a
message's trip through the broker, and lists the hottest functions.

    stages.py [--churn] PROFILE.folded [US_PER_UNIT]

A stack inside a system call is charged to that call (so kernel TCP work
inside a send(), loopback delivery to the peer included, counts as write);
any other stack to the innermost frame that names a stage (walking from the
leaf toward the root), so a memcpy inside encode_body_frames counts as encode. With
US_PER_MESSAGE (the broker's CPU per message from warren-perf), shares are also
given in microseconds per message. With --churn, the stages are those of a
connection's life (accept, handshake, declare, publish, close) instead.
"""
import collections
import re
import sys

RULES = [
    ("alloc", r"(^|::|_)mi_|^_mi|__rust_alloc|__rust_dealloc|__rust_realloc|\bmalloc\b|\bfree\b|\brealloc\b|alloc::raw_vec"),
    ("locks", r"parking_lot|lock_api::"),
    ("decode", r"parse_frame|Method::decode|BasicProperties::decode|decode_arguments|table::Decoder|decode_table"),
    ("encode", r"encode_body_frames|encode_header_frame|encode_method_frame|put_shortstr|BasicProperties::encode|Method::encode|encode_arguments|encode_deliver|encode_table"),
    ("read (user side of recv)", r"tcp_recvmsg|__libc_recv|\brecvfrom\b|read_more|sock_recvmsg"),
    ("write (outbox writer, user side of send)", r"tcp_sendmsg|__libc_send|\bwritev\b|sendmsg|run_writer|sock_write_iter"),
    ("store (writer thread, fsync)", r"^warren-store-wr$|warren_store::"),
    ("enqueue", r"Queue::publish|Queue::push|Queue::enqueue"),
    ("dispatch (to consumer)", r"Queue::dispatch|DeliveryTarget>::deliver|Outbox::push|Outbox::with"),
    ("ack (settle)", r"Queue::settle|apply_ack|channel::settle|Queue::ack"),
    ("route", r"route_and_enqueue|exchange::|Exchange::route|topic::"),
    ("confirms", r"flush_confirms|confirm"),
    ("frame handling (channel state)", r"handle_body|handle_header|finish_publish|handle_method|dispatch_method|handle_frame|connection::run"),
    ("wakeups, scheduling, epoll", r"epoll|schedule|futex|tokio::runtime|mio::|try_to_wake_up|finish_task_switch|do_idle|cpu_startup"),
    ("kernel network (softirq)", r"softirq|tcp_v4_rcv|net_rx_action|__dev_queue_xmit|ip_rcv"),
]
CHURN_RULES = [
    ("alloc", RULES[0][1]),
    ("locks", RULES[1][1]),
    ("write (send + kernel, loopback delivery)", r"tcp_sendmsg|__libc_send|\bwritev\b|sendmsg|__x64_sys_sendto|__x64_sys_write"),
    ("read (recv + kernel)", r"tcp_recvmsg|__libc_recv|\brecvfrom\b|sock_recvmsg|__x64_sys_recvfrom|__x64_sys_read"),
    ("socket setup and teardown (accept, epoll_ctl, setsockopt, shutdown, close)", r"accept4|__x64_sys_accept|epoll_ctl|setsockopt|__x64_sys_shutdown|__x64_sys_close|tcp_close|inet_release|__fput|TcpListener|PollEvented<.*>::new|Registration::new|drop_in_place<tokio::net"),
    ("logging and tracing", r"tracing::|tracing_core::|tracing_subscriber::|fmt::write|format_inner|alloc::fmt::format"),
    ("decode", RULES[2][1]),
    ("encode", RULES[3][1]),
    ("queue.declare / delete (vhost, names)", r"vhost::|Vhost::|declare_queue|delete_queue|queue_declare|queue_delete|names::|Queue::new|exclusive"),
    ("handshake (start, tune, open, auth)", r"handshake_steps|auth::|access::"),
    ("publish, route, confirm", r"route_and_enqueue|Queue::publish|finish_publish|handle_body|handle_header|flush_confirms"),
    ("connection and channel state", r"handle_method|dispatch_method|handle_frame|connection::run|Conn::|Channel::|outbox::|accept_loop|serve"),
    ("task spawn, wakeups, scheduling, epoll", r"epoll|schedule|futex|tokio::runtime|mio::|try_to_wake_up|finish_task_switch|do_idle|Condvar"),
    ("kernel network (softirq)", RULES[-1][1]),
]
RULES = [(name, re.compile(rx) if isinstance(rx, str) else rx) for name, rx in RULES]
CHURN_RULES = [(name, re.compile(rx) if isinstance(rx, str) else rx) for name, rx in CHURN_RULES]


SYSCALLS = [
    ("read (recv + kernel)", r"recvfrom|recvmsg|^read$|readv"),
    ("write (send + kernel, incl. loopback delivery to the peer)", r"sendto|sendmsg|^write$|writev"),
    ("epoll_wait (idle, wakeups)", r"epoll_wait|epoll_pwait"),
    ("futex (thread wakeups)", r"futex"),
    ("socket setup and teardown (accept, epoll_ctl, setsockopt, shutdown, close)", r"accept|epoll_ctl|setsockopt|shutdown|close"),
    ("store and spill I/O (pread, pwrite, fdatasync)", r"pread|pwrite|fdatasync|fsync|madvise|unlink|openat"),
    ("sched_yield", r"sched_yield"),
]
SYSCALLS = [(name, re.compile(rx)) for name, rx in SYSCALLS]
SYS_FRAME = re.compile(r"^__x64_sys_(\w+)$")


def stage_of(frames, rules=None):
    # Work inside a system call is charged to the call (a send() pays for the
    # loopback delivery to its peer, a recv() for the copy out).
    for f in frames:
        m = SYS_FRAME.match(f)
        if m:
            for name, rx in SYSCALLS:
                if rx.search(m.group(1)):
                    return name
            return "other system calls"
    for f in reversed(frames):
        for name, rx in rules or RULES:
            if rx.search(f):
                return name
    return "other"


def main():
    argv = sys.argv[1:]
    rules = RULES
    if argv and argv[0] == "--churn":
        rules = CHURN_RULES
        argv = argv[1:]
    path = argv[0]
    us = float(argv[1]) if len(argv) > 1 else None
    stages = collections.Counter()
    selfs = collections.Counter()
    total = 0
    for line in open(path):
        stack, n = line.rstrip("\n").rsplit(" ", 1)
        n = int(n)
        frames = stack.split(";")
        total += n
        stages[stage_of(frames, rules)] += n
        selfs[frames[-1]] += n
    print("| stage | share | µs per unit |" if us else "| stage | share |")
    print("|---|---:|---:|" if us else "|---|---:|")
    for name, n in stages.most_common():
        share = 100.0 * n / total
        if us:
            print(f"| {name} | {share:.1f} % | {us * n / total:.3f} |")
        else:
            print(f"| {name} | {share:.1f} % |")
    print()
    print("Top functions by self time:")
    print()
    print("| function | self |")
    print("|---|---:|")
    for f, n in selfs.most_common(25):
        print(f"| `{f[:110]}` | {100.0 * n / total:.1f} % |")


if __name__ == "__main__":
    main()
