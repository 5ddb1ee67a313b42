#!/usr/bin/env bash
# Installs everything acmrs needs on a fresh Debian 12 machine (run as root).
# Idempotent: re-running only checks that things are present.
set -euo pipefail

PKGS=(
  # the real ibacm daemon, ib_acme, the stock provider libibacmp and the ABI headers
  ibacm rdma-core libibverbs-dev libibumad-dev librdmacm-dev ibverbs-utils
  # simulated fabric: ibsim, umad2sim, a real subnet manager and its diagnostics
  ibsim-utils libumad2sim0 opensm infiniband-diags
  # Wireshark's dissectors for the SA MAD cross-check
  tshark
  # bindgen (rdma-sys) needs libclang; C header tests need a compiler
  libclang-dev pkg-config build-essential libc6-dev
  # leak checks; the stacks of a hung test's processes (acm_fabric::process::describe_tree)
  valgrind gdb
  # mount namespaces for per-daemon /run (unshare, mount)
  util-linux procps
  # the stats textfile checked by real Prometheus parsers (promtool, prometheus_client)
  prometheus python3-prometheus-client
  # the .deb and its man page (scripts/package.sh, tools/fabric/tests/package.rs): pandoc
  # builds acmrs(7) from docs/acmrs.7.md, man-db + groff-base check it renders without
  # warnings, dpkg-dev gives cargo-deb dpkg-shlibdeps
  pandoc man-db groff-base dpkg-dev
  # the resolver as Cortex-M4F firmware under QEMU's mps2-an386 (scripts/firmware-qemu.sh)
  qemu-system-arm
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  # tshark asks whether non-root users may capture; answer no without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "install-deps: cargo not found (this project needs the machine's Rust toolchain, stable 1.95)" >&2
  exit 1
fi
for t in thumbv7em-none-eabihf riscv32imac-unknown-none-elf; do
  rustup target list --installed | grep -qx "$t" || rustup target add "$t"
done
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
echo "install-deps: ok"
