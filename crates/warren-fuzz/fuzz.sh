#!/usr/bin/env bash
# Runs Warren's fuzz targets with cargo-fuzz (libFuzzer) for a bounded time.
#
#   crates/warren-fuzz/fuzz.sh                          # every target, 60 s each
#   FUZZ_SECONDS=600 crates/warren-fuzz/fuzz.sh connection
#   FUZZ_BUILD=quick FUZZ_BUDGET=240 crates/warren-fuzz/fuzz.sh   # what CI does
#
# Targets (crates/warren-fuzz/src, one binary each in fuzz/fuzz_targets): frame_reader,
# method_decode, table_decode, connection. Each run starts from the committed corpus
# (fuzz/corpus/<target>, left unchanged) and writes what it finds to a scratch corpus
# (FUZZ_WORK, default a temporary directory); pass FUZZ_WORK=crates/warren-fuzz/fuzz/corpus to
# grow the committed corpus instead (then minimise it with `cargo fuzz cmin`).
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 60; ignored when FUZZ_BUDGET is set)
#   FUZZ_BUDGET     seconds for everything, installing cargo-fuzz and building included; what
#                   is left after the build is shared by the targets (at least 10 s each).
#                   0 skips fuzzing with a message.
#   FUZZ_BUILD      full (default: optimised, one codegen unit, AddressSanitizer) or quick
#                   (opt-level 1, 16 codegen units, no sanitizer: builds in about half the
#                   CPU time and runs several times faster; it finds panics, overflows and
#                   hangs, which is what safe Rust code can do wrong; CI uses it)
#
# Both builds keep debug assertions and overflow checks on.
#
# cargo-fuzz needs nightly-only compiler flags; on a stable toolchain they are unlocked with
# RUSTC_BOOTSTRAP=1, which this script sets. cargo-fuzz is installed with `cargo install` if it
# is missing. A crash stops the run with a non-zero status; the input is kept under
# crates/warren-fuzz/fuzz/artifacts/<target>/ and printed in hex. To debug it outside
# libFuzzer: `cargo run -p warren-fuzz --example replay -- <target> <file>`. Once the fault is
# fixed, keep the input: copy it into fuzz/corpus/<target>/ (cargo test replays the corpus) and
# spell it out as a test in crates/warren-fuzz/tests/regressions.rs.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
START=$SECONDS
ALL_TARGETS=(frame_reader method_decode table_decode connection)
if [ "$#" -gt 0 ]; then
    TARGETS=("$@")
else
    TARGETS=("${ALL_TARGETS[@]}")
fi
case "${FUZZ_BUILD:-full}" in
    full) BUILD=(-O -a --sanitizer address) ;;
    quick)
        BUILD=(-O -a --sanitizer none --codegen-units 16 --target-dir "$HERE/fuzz/target/quick")
        export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
        ;;
    *) echo "FUZZ_BUILD must be full or quick" >&2; exit 2 ;;
esac
CARGO_FUZZ_VERSION=0.13.2

say() { echo "[fuzz] $*" >&2; }

if [ -n "${FUZZ_BUDGET:-}" ] && [ "$FUZZ_BUDGET" -le 0 ]; then
    say "skipped: FUZZ_BUDGET=$FUZZ_BUDGET"
    exit 0
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    say "installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
export RUSTC_BOOTSTRAP=1

say "building ${TARGETS[*]} (${FUZZ_BUILD:-full}: ${BUILD[*]})"
for t in "${TARGETS[@]}"; do
    cargo fuzz build "${BUILD[@]}" "$t"
done
say "installed and built in $((SECONDS - START)) s"

if [ -n "${FUZZ_BUDGET:-}" ]; then
    left=$((FUZZ_BUDGET - (SECONDS - START)))
    PER=$((left / ${#TARGETS[@]}))
    if [ "$PER" -lt 10 ]; then
        say "budget of $FUZZ_BUDGET s mostly spent building; running each target 10 s anyway"
        PER=10
    fi
else
    PER=${FUZZ_SECONDS:-60}
fi

WORK=${FUZZ_WORK:-$(mktemp -d /tmp/warren-fuzz.XXXXXX)}
for t in "${TARGETS[@]}"; do
    mkdir -p "$WORK/$t"
    say "$t: ${PER} s"
    # The connection target's inputs are sessions of many frames: allow longer ones than
    # libFuzzer's default, and from the start.
    extra=()
    [ "$t" = connection ] && extra=(-max_len=2048 -len_control=0)
    corpus=("$WORK/$t")
    [ "$WORK" != "$HERE/fuzz/corpus" ] && corpus+=("$HERE/fuzz/corpus/$t")
    if ! cargo fuzz run "${BUILD[@]}" "$t" "${corpus[@]}" -- \
        -max_total_time="$PER" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
        "${extra[@]}" >"$WORK/$t.log" 2>&1; then
        tail -n 60 "$WORK/$t.log" >&2
        for f in "$HERE"/fuzz/artifacts/"$t"/*; do
            [ -f "$f" ] || continue
            say "input that fails $t: $f"
            od -An -tx1 -v "$f" | head -n 40 >&2
        done
        say "FAIL: $t"
        exit 1
    fi
    grep -E "^Done|stat::number_of_executed_units|stat::new_units_added" "$WORK/$t.log" | sed "s/^/[fuzz] $t: /" >&2 || true
done
say "all targets ran clean (${PER} s each); total $((SECONDS - START)) s"
