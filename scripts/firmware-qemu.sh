#!/usr/bin/env bash
# Runs the resolver of acm-core-nostd as firmware on an emulated Cortex-M4F (QEMU's
# mps2-an386) and checks its transcript byte for byte against a host run of the same recorded
# sequence (acm-core-nostd/examples/firmware, docs/firmware.md). Also reports the firmware's
# flash and RAM and the instructions a cache hit and a miss take.
#   bash scripts/firmware-qemu.sh
# Needs qemu-system-arm (bash scripts/install-deps.sh) and the thumbv7em-none-eabihf target.
# Last line: "firmware: 1 passed, 0 failed" or "firmware: 0 passed, 1 failed".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIR=acm-core-nostd/examples/firmware
TARGET=thumbv7em-none-eabihf
MACHINE=mps2-an386
# The firmware converts SysTick ticks to instructions for this shift (src/main.rs ICOUNT_SHIFT).
ICOUNT_SHIFT=7
export CARGO_TERM_COLOR=never

WORK=$(mktemp -d /tmp/acm-firmware.XXXXXX)
keep_work=0
cleanup() { if ((keep_work == 0)); then rm -rf "$WORK"; fi; }
trap cleanup EXIT

fail() {
  echo "firmware: FAIL: $*"
  if [[ -n $(ls -A "$WORK" 2>/dev/null) ]]; then
    keep_work=1
    echo "firmware: outputs kept in $WORK"
  fi
  echo "firmware: 0 passed, 1 failed"
  exit 1
}

command -v qemu-system-arm >/dev/null ||
  fail "qemu-system-arm not found: apt-get install qemu-system-arm (or bash scripts/install-deps.sh)"
machines=$(qemu-system-arm -M help)
grep -q "^$MACHINE " <<<"$machines" ||
  fail "this qemu-system-arm has no machine $MACHINE ($(qemu-system-arm --version | head -1))"
command -v cargo >/dev/null || fail "cargo not found"
if command -v rustup >/dev/null && ! grep -qx "$TARGET" <<<"$(rustup target list --installed)"; then
  fail "Rust target $TARGET not installed: rustup target add $TARGET"
fi
if command -v llvm-size >/dev/null; then SIZE=llvm-size; else SIZE=size; fi

# Builds go to a subdirectory of the repository's target directory (the example is not a
# workspace member: it would otherwise get a target/ of its own).
TD=${CARGO_TARGET_DIR:-target}
[[ $TD == /* ]] || TD=$ROOT/$TD
export CARGO_TARGET_DIR=$TD/acm-firmware

# Inside the example: its .cargo/config.toml gives the firmware link arguments (-Tlink.x).
echo "firmware: building ($DIR, --release: $TARGET and host)"
(cd "$DIR" && cargo build --release --locked --quiet --target "$TARGET") 2>"$WORK/build-fw.log" ||
  { cat "$WORK/build-fw.log"; fail "firmware build failed"; }
(cd "$DIR" && cargo build --release --locked --quiet) 2>"$WORK/build-host.log" ||
  { cat "$WORK/build-host.log"; fail "host build failed"; }
ELF=$CARGO_TARGET_DIR/$TARGET/release/acm-firmware
HOST=$CARGO_TARGET_DIR/release/acm-firmware
[[ -f $ELF && -x $HOST ]] || fail "build produced no $ELF or $HOST"

# The host transcript.
host_rc=0
"$HOST" >"$WORK/host.txt" 2>"$WORK/host.err" || host_rc=$?

# The firmware: semihosting output on QEMU's stdout; the guest's exit status is QEMU's.
qemu_rc=0
timeout 60 qemu-system-arm -M "$MACHINE" -nographic \
  -semihosting-config enable=on,target=native -icount shift=$ICOUNT_SHIFT \
  -kernel "$ELF" </dev/null >"$WORK/qemu.txt" 2>"$WORK/qemu.err" || qemu_rc=$?

show() { cut -c1-160 "$1" | tail -n "${2:-10}" | sed 's/^/  | /'; }
if ((qemu_rc == 124)); then
  show "$WORK/qemu.txt"
  fail "QEMU did not exit within 60 s"
fi
if ((qemu_rc != 0)); then
  show "$WORK/qemu.txt"
  show "$WORK/qemu.err"
  fail "the firmware exited with status $qemu_rc (a failed check, a panic or a fault)"
fi
if ((host_rc != 0)); then
  show "$WORK/host.txt"
  show "$WORK/host.err"
  fail "the host run exited with status $host_rc"
fi

# QEMU's output is the host's transcript, byte for byte, then the firmware's `measure` lines
# (instruction counts and stack use, which the host cannot measure) and nothing else.
host_bytes=$(wc -c <"$WORK/host.txt")
head -c "$host_bytes" "$WORK/qemu.txt" >"$WORK/qemu-transcript.txt"
tail -c +"$((host_bytes + 1))" "$WORK/qemu.txt" >"$WORK/qemu-measure.txt"
end_line=$(tail -n 1 "$WORK/host.txt")
if ! cmp -s "$WORK/qemu-transcript.txt" "$WORK/host.txt"; then
  echo "firmware: transcripts differ (QEMU <, host >):"
  diff <(cut -c1-160 "$WORK/qemu-transcript.txt") <(cut -c1-160 "$WORK/host.txt") | head -20 || true
  cmp "$WORK/qemu-transcript.txt" "$WORK/host.txt" || true
  fail "QEMU's transcript is not the host's"
fi
if [[ $end_line != end\ outputs=* ]]; then
  fail "the transcript does not end with its summary line: $end_line"
fi
if grep -qv '^measure ' "$WORK/qemu-measure.txt"; then
  echo "firmware: QEMU printed more than the host's transcript:"
  grep -v '^measure ' "$WORK/qemu-measure.txt" | cut -c1-160 | head -5
  fail "unexpected firmware output after the transcript"
fi
if ! grep -q ' failed=0 ' <<<"$end_line"; then
  grep '^check .* FAILED$' "$WORK/host.txt" || true
  fail "a check failed: $end_line"
fi

# Sizes: flash = code and constants (.text + .rodata, plus the 1 KiB vector table and the
# .data load image), RAM = .data + .bss (plus the stack, measured by the firmware).
sec() { $SIZE -A "$ELF" | awk -v s="$1" '$1 == s { print $2 + 0; f = 1 } END { if (!f) print 0 }'; }
text=$(sec .text)
rodata=$(sec .rodata)
vectors=$(sec .vector_table)
data=$(sec .data)
bss=$(sec .bss)
measure() { sed -n "s/.*$1=\\([0-9]*\\).*/\\1/p" "$WORK/qemu-measure.txt" | head -1; }
outputs=$(sed -n 's/.*outputs=\([0-9]*\).*/\1/p' <<<"$end_line")
checks=$(sed -n 's/.*checks=\([0-9]*\).*/\1/p' <<<"$end_line")
digest=$(sed -n 's/.*digest=\([0-9a-f]*\).*/\1/p' <<<"$end_line")
part() { sed -n "s/^measure $1 ticks=[0-9]* instructions=\\([0-9]*\\)$/\\1/p" "$WORK/qemu-measure.txt"; }

echo "firmware: $(qemu-system-arm --version | head -1), machine $MACHINE (Cortex-M4F), $TARGET"
echo "firmware: QEMU = host, byte for byte: $(wc -l <"$WORK/host.txt") lines, $host_bytes bytes;" \
  "$outputs outputs, $checks checks passed, digest $digest"
echo "firmware: flash .text+.rodata = $((text + rodata)) B (.text $text, .rodata $rodata;" \
  "+ .vector_table $vectors, .data image $data)"
echo "firmware: RAM .data+.bss = $((data + bss)) B (.bss $bss), + peak stack $(measure stack-peak) B"
echo "firmware: instructions (-icount shift=$ICOUNT_SHIFT, SysTick): per hit $(measure per-hit)" \
  "(classify $(part hit-classify), lookup $(part hit-lookup), respond $(part hit-respond));" \
  "per miss $(measure per-miss) (request $(part miss-request) + SA reply $(part miss-reply));" \
  "hit through the resolver $(measure per-hit-resolver)"
# Every table slot's empty state is all zero bytes (resolver/storage.rs), so the firmware's
# static tables live in .bss; a non-zero field in an EMPTY const moves them into .data, a
# flash image of kilobytes copied at boot.
if [[ "$data" -ne 0 ]]; then
    echo "firmware: FAIL: .data is $data B: a static's initial value is not all zero bytes" \
        "(an EMPTY slot with a non-zero field?)" >&2
    echo "firmware: 0 passed, 1 failed"
    exit 1
fi
echo "firmware: PASS"
echo "firmware: 1 passed, 0 failed"
