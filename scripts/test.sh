#!/usr/bin/env bash
# Runs every check and test of acmrs. Installs what it needs first (Debian 12, as root).
#   bash scripts/test.sh            # everything
#   FUZZ_SECONDS=30 bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FUZZ_SECONDS=${FUZZ_SECONDS:-8}
export CARGO_TERM_COLOR=never
LOG_DIR=$(mktemp -d /tmp/acmrs-test-log.XXXXXX)
trap 'rm -rf "$LOG_DIR"' EXIT

step() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

step "install dependencies"
bash scripts/install-deps.sh

step "format"
cargo fmt --all -- --check

step "build (workspace, debug: the tests load these .so files)"
cargo build --workspace --all-targets

step "clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "acmrs(7): pandoc builds it, man renders it without warnings"
pandoc -s -t man docs/acmrs.7.md -o "$LOG_DIR/acmrs.7"
man_warnings=$(MANWIDTH=80 man --warnings -l "$LOG_DIR/acmrs.7" 2>&1 >/dev/null || true)
if [[ -n $man_warnings ]]; then
  printf '%s\n' "$man_warnings"
  exit 1
fi
echo "docs/acmrs.7.md: no warnings"

step "acm-core-nostd on bare-metal targets (no std, no allocator)"
for t in thumbv7em-none-eabihf riscv32imac-unknown-none-elf; do
  cargo build -p acm-core-nostd --target "$t" --release --quiet
  # The minimal resolver user whose size docs/resolver.md reports (its own workspace).
  (cd acm-core-nostd/examples/flash-size && cargo build --release --locked --quiet --target "$t")
  echo "built for $t (the core, and examples/flash-size)"
done

firmware_rc=0
step "the resolver as firmware under QEMU (mps2-an386), checked against the host"
bash scripts/firmware-qemu.sh || firmware_rc=$?

step "libacmrs.so as users install it (release: fat LTO, one codegen unit)"
# The real-daemon tests load this build, the one the .deb ships (acm_fabric reads
# ACM_FABRIC_ACMRS); the in-process tests keep the debug build with its assertions.
cargo build --release -p acm-plugin --quiet
export ACM_FABRIC_ACMRS="${CARGO_TARGET_DIR:-$ROOT/target}/release/libacmrs.so"
echo "real-daemon tests load $ACM_FABRIC_ACMRS"

step "tests"
set +e
cargo test --workspace --no-fail-fast 2>&1 | tee "$LOG_DIR/test.log"
rc=${PIPESTATUS[0]}
set -e

step "loom models: the cache seqlock, the worker's park handshake (acm-core-nostd/tests/*_loom.rs)"
# Own target dir: --cfg loom changes every crate's fingerprint. Preemption bound 1 takes ~45 s on
# 2 cores; LOOM_MAX_PREEMPTIONS=2 explores more (~9 min; run it by hand, see docs/cache.md).
set +e
LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-1} RUSTFLAGS="--cfg loom" \
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
  cargo test -p acm-core-nostd --test cache_loom --test park_loom --release 2>&1 | tee -a "$LOG_DIR/test.log"
loom_rc=${PIPESTATUS[0]}
set -e
if ((loom_rc != 0 && rc == 0)); then rc=$loom_rc; fi

fuzz_rc=0
step "fuzz (${FUZZ_SECONDS}s per target)"
bash fuzz/run.sh "$FUZZ_SECONDS" || fuzz_rc=$?

passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$LOG_DIR/test.log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$LOG_DIR/test.log" | awk '{s+=$1} END {print s+0}')
if ((fuzz_rc != 0)); then
  echo "fuzzing found a failure (exit $fuzz_rc)"
  failed=$((failed + 1))
fi
if ((firmware_rc != 0)); then
  echo "the firmware run failed (exit $firmware_rc)"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
# A test that cannot run fails with its reason; nothing may report skipping instead.
skipped=$(grep -Ec '^SKIPPED|: skipped$' "$LOG_DIR/test.log" || true)
if ((skipped > 0)); then
  echo "something reported skipping ($skipped line(s)); a test that cannot run must fail:"
  grep -E '^SKIPPED|: skipped$' "$LOG_DIR/test.log" | head -20
  failed=$((failed + 1))
fi
if ((rc != 0 && failed == 0)); then
  echo "cargo test exited $rc without reporting a failed test (build failure?)"
  failed=1
fi
step "summary"
echo "acmrs: ${passed} passed, ${failed} failed"
((failed == 0))
