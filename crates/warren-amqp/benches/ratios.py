#!/usr/bin/env python3
"""Turns the text output of the `codec` criterion bench into a markdown table.

Usage: cargo bench -p warren-amqp --bench codec -- --warm-up-time 1 --measurement-time 3 \
           | tee codec.txt
       python3 crates/warren-amqp/benches/ratios.py codec.txt

Ratio = amq-protocol time / Warren time (the point estimate of each), i.e. how many times
Warren's throughput is amq-protocol's on the same input, measured in the same run.
"""
import re
import sys

UNITS = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}


def parse(text):
    times = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^(\S+/(warren|amq-protocol))\s*(time:.*)?$", line)
        if m:
            name = m.group(1)
            line = m.group(3) or ""
        m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if m and name:
            times[name] = float(m.group(1)) * UNITS[m.group(2)]
            name = None
    return times


def fmt(ns):
    return f"{ns / 1e3:.3f} µs" if ns >= 1e3 else f"{ns:.1f} ns"


def main():
    times = parse(open(sys.argv[1], encoding="utf-8").read())
    cases = [n[: -len("/warren")] for n in times if n.endswith("/warren")]
    print("| case | Warren | amq-protocol | ratio |")
    print("| --- | ---: | ---: | ---: |")
    worst = None
    for case in cases:
        w, a = times[case + "/warren"], times.get(case + "/amq-protocol")
        if a is None:
            continue
        r = a / w
        worst = r if worst is None else min(worst, r)
        print(f"| {case} | {fmt(w)} | {fmt(a)} | {r:.2f}x |")
    if worst is not None:
        print(f"\nlowest ratio: {worst:.2f}x")


if __name__ == "__main__":
    main()
