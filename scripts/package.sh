#!/usr/bin/env bash
# Builds the acmrs Debian package with cargo-deb and prints the path of the .deb it wrote (the
# only line on stdout; progress goes to stderr). On a fresh Debian 12 machine as root it first
# installs what it needs (Debian packages, cargo-deb from crates.io).
#
#   deb=$(bash scripts/package.sh)
#   dpkg -i "$deb"                      # needs ibacm (Depends: ibacm)
#
# Package contents (the asset list is [package.metadata.deb] in acm-plugin/Cargo.toml):
#   /usr/lib/x86_64-linux-gnu/ibacm/libacmrs.so   ibacm's default provider directory
#   /usr/bin/madtool                               MAD decoder (troubleshooting)
#   /usr/bin/acmrs-stat                            live counters and latency tables of a daemon
#   /usr/share/man/man7/acmrs.7.gz                 from docs/acmrs.7.md (pandoc)
#   /usr/share/doc/acmrs/ibacm_opts.cfg.example    the lines to add to ibacm_opts.cfg
#   /usr/share/doc/acmrs/copyright                 (cargo-deb)
# acm-fabric is not packaged: it is the simulated-fabric test harness (ibsim, umad2sim, OpenSM,
# libsimverbs.so, root and mount namespaces), useless on a cluster with real hardware.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf 'package: %s\n' "$*" >&2; }

# Debian packages: pandoc (the man page, as rdma-core builds its pages), man-db + groff-base
# (the warning check), dpkg-dev (dpkg-shlibdeps for cargo-deb's $auto depends), a C toolchain
# and libibumad-dev (madtool links libibumad).
PKGS=(pandoc man-db groff-base dpkg-dev build-essential pkg-config libibumad-dev gzip)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
if ! command -v cargo >/dev/null; then
  log "cargo not found (this project needs the machine's Rust toolchain)"
  exit 1
fi
if ! cargo deb --version >/dev/null 2>&1; then
  log "installing cargo-deb (cargo install cargo-deb --locked; a few minutes on 2 cores)"
  cargo install cargo-deb --locked >&2
fi

# The real target directory (CARGO_TARGET_DIR or the workspace's target/).
meta=$(cargo metadata --format-version 1 --no-deps)
target=$(printf '%s' "$meta" | grep -o '"target_directory":"[^"]*"' | head -1 | cut -d'"' -f4)
[[ -n $target ]] || { log "cannot find the cargo target directory"; exit 1; }

log "building libacmrs.so, madtool and acmrs-stat (release)"
cargo build --release --locked -p acm-plugin -p acm-madtool -p acmrs-stat >&2

log "acmrs(7) from docs/acmrs.7.md"
man_dir="$target/release/man"
mkdir -p "$man_dir"
pandoc -s -t man docs/acmrs.7.md -o "$man_dir/acmrs.7"
warnings=$(MANWIDTH=80 man --warnings -l "$man_dir/acmrs.7" 2>&1 >/dev/null || true)
if [[ -n $warnings ]]; then
  log "acmrs.7 renders with warnings:"
  printf '%s\n' "$warnings" >&2
  exit 1
fi
gzip -9 -n -f -k "$man_dir/acmrs.7"

log "cargo deb"
out_dir="$target/debian"
mkdir -p "$out_dir"
# --strip: the release profile keeps line tables (debug = 1) for the benches; the package
# ships stripped binaries.
deb=$(cargo deb -p acm-plugin --no-build --strip --output "$out_dir" | tail -n 1)
if [[ ! -f $deb ]]; then
  log "cargo deb wrote no package (its last line: $deb)"
  exit 1
fi
depends=$(dpkg-deb --field "$deb" Depends)
if [[ $depends != *"ibacm"* ]]; then
  log "$deb does not depend on ibacm: $depends"
  exit 1
fi
log "$(dpkg-deb --field "$deb" Package Version Architecture Depends | tr '\n' ' ')"
printf '%s\n' "$deb"
