#!/usr/bin/env bash
# The main job: on a simulated InfiniBand fabric (ibsim + real OpenSM, simulated verbs) start
# real ibacm daemons that load our provider libacmrs.so, resolve paths with the real ib_acme,
# print them, and tear everything down. Needs root (each daemon gets a private /run).
#   bash scripts/run-main.sh                 # acmrs
#   PROVIDER=stock bash scripts/run-main.sh  # the same with Debian's libibacmp.so
set -euo pipefail
cd "$(dirname "$0")/.."
PROVIDER=${PROVIDER:-acmrs}

bash scripts/install-deps.sh
echo "=== building (release)"
cargo build --release --quiet -p simverbs -p acm-plugin -p acm-fabric
FAB=target/release/acm-fabric

if [[ -e /dev/infiniband/uverbs0 ]]; then
  echo "note: InfiniBand hardware found; this job still runs on the simulated fabric" >&2
fi

run() { # title, node, ib_acme args...
  local title=$1 node=$2; shift 2
  echo
  echo "=== $title  (ib_acme $* on $node, provider $PROVIDER)"
  "$FAB" run --provider "$PROVIDER" --nodes Hca2,Hca3,Hca4 --name-prefix main --opt addr_preload=acm_hosts \
    --on "$node" --timeout 20 -- "$@"
}

run "endpoints" Hca3 -e
run "path by LID 5 -> 6, verified against the SA" Hca3 -f l -s 5 -d 6 -v
run "path by GID, verified against the SA" Hca3 -f g -s fe80::10:7 -d fe80::10:a -v
run "path to a host name (hosts preload), verified" Hca3 -f n -s hca3 -d hca4 -v
run "path to an IPv4 address (hosts preload)" Hca3 -f i -s 10.40.0.3 -d 10.40.0.4 -v
echo
echo "=== done: every fabric process was stopped and its scratch directory removed"
