#!/usr/bin/env bash
# Build every fuzz target of acm-core-nostd with libFuzzer instrumentation on *stable* Rust and
# run each for a short time. No cargo-fuzz, no nightly: the flags below are what
# `cargo fuzz build -s none` passes to rustc.
#
# usage: fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  default 10
#   TARGET...           default: every [[bin]] in fuzz/Cargo.toml
# env:
#   FUZZ_TARGET_DIR     cargo target dir (default: fuzz/target, git-ignored)
#   FUZZ_ARTIFACTS      where crash inputs are kept (default: a new dir under /tmp)
#   FUZZ_JOBS           cargo build jobs (default: cargo's default)
#
# The checked-in seed corpus (fuzz/corpus/<target>/) is copied to a temporary directory before
# each run, so new inputs never land in the repository. Exit status: 0 if every target ran its
# time without a crash, 1 otherwise (the crashing inputs are listed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
secs="${1:-10}"
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ "$secs" =~ ^[0-9]+$ ]] || [[ "$secs" -eq 0 ]]; then
    echo "run.sh: SECONDS_PER_TARGET must be a positive integer, got '$secs'" >&2
    exit 2
fi

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' "$here/Cargo.toml" | grep -v '^acmrs-fuzz$')
fi

host="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$here/target}"
# Same instrumentation as cargo-fuzz with `-s none` (sanitizer-coverage for libFuzzer's
# feedback, `--cfg fuzzing`), plus debug assertions and overflow checks so arithmetic bugs crash.
# An explicit --target keeps these flags away from build scripts (libfuzzer-sys' build.rs).
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks \
${FUZZ_EXTRA_RUSTFLAGS:-}"

build_args=(build --release --locked --manifest-path "$here/Cargo.toml" --target "$host")
if [[ -n "${FUZZ_JOBS:-}" ]]; then build_args+=(--jobs "$FUZZ_JOBS"); fi
for t in "${targets[@]}"; do build_args+=(--bin "$t"); done
echo "run.sh: building ${#targets[@]} fuzz targets (target dir $CARGO_TARGET_DIR)"
start=$(date +%s)
if ! cargo "${build_args[@]}"; then
    echo "run.sh: build failed. If cargo says the lock file needs updating (a dependency of" >&2
    echo "acm-core-nostd changed), run: cargo update --manifest-path $here/Cargo.toml" >&2
    echo "and commit fuzz/Cargo.lock." >&2
    exit 1
fi
echo "run.sh: build took $(($(date +%s) - start)) s"

artifacts="${FUZZ_ARTIFACTS:-$(mktemp -d /tmp/acmrs-fuzz-artifacts.XXXXXX)}"
mkdir -p "$artifacts"
work="$(mktemp -d /tmp/acmrs-fuzz-work.XXXXXX)"
trap 'rm -rf "$work"' EXIT

failed=()
for t in "${targets[@]}"; do
    bin="$CARGO_TARGET_DIR/$host/release/$t"
    corpus="$work/$t"
    mkdir -p "$corpus" "$artifacts/$t"
    if [[ -d "$here/corpus/$t" ]]; then
        cp -R "$here/corpus/$t/." "$corpus/"
    fi
    echo "run.sh: fuzzing $t for $secs s (seeds: $(find "$corpus" -type f | wc -l))"
    if "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/$t/" "$corpus" >"$work/$t.log" 2>&1; then
        grep -E '^stat::number_of_executed_units' "$work/$t.log" | sed "s/^/run.sh: $t: /" || true
    else
        echo "run.sh: $t FAILED; last lines of its log:" >&2
        tail -n 40 "$work/$t.log" >&2
        failed+=("$t")
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "run.sh: crashes in: ${failed[*]}; inputs under $artifacts" >&2
    exit 1
fi
if [[ -z "${FUZZ_ARTIFACTS:-}" ]]; then rm -rf "$artifacts"; fi
echo "run.sh: all ${#targets[@]} targets ran ${secs} s each without a crash"
