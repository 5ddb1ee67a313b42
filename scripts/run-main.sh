#!/usr/bin/env bash
# The main job: on a simulated InfiniBand fabric (ibsim + real OpenSM, simulated verbs) start
# real ibacm daemons that load our provider libacmrs.so, resolve paths with the real ib_acme,
# print them, and tear everything down. Needs root (each daemon gets a private /run).
# Then a mixed fabric (Hca2 stock, Hca3 and Hca4 acmrs) with no hosts file, partitions, and
# hosts of several HCAs and ports on two subnets.
#   bash scripts/run-main.sh                     # acmrs, then the mixed fabric
#   PROVIDER=stock bash scripts/run-main.sh      # the first part with Debian's libibacmp.so
set -euo pipefail
cd "$(dirname "$0")/.."
PROVIDER=${PROVIDER:-acmrs}
MIXED=Hca2=stock,Hca3=acmrs,Hca4=acmrs
BIN=${CARGO_TARGET_DIR:-target}/release

bash scripts/install-deps.sh
echo "=== building (release)"
cargo build --release --quiet -p simverbs -p acm-plugin -p acm-fabric

if [[ -e /dev/infiniband/uverbs0 ]]; then
  echo "note: InfiniBand hardware found; this job still runs on the simulated fabric" >&2
fi

echo "=== ibsim (net.2sw2path4hca) + OpenSM + real ibacm on Hca2, Hca3, Hca4 with provider $PROVIDER"
# One bring-up; each step is printed with ib_acme's output; teardown by PID at the end.
"$BIN/acm-fabric" script --provider "$PROVIDER" --nodes Hca2,Hca3,Hca4 \
  --name-prefix main --hosts-file preload --retry 10 - <<'STEPS'
# the endpoints ibacm assigned to the provider
Hca3: -e
# a path by LID, checked against the SA (ib_acme -v re-asks the SA through the provider)
Hca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v
# the same destination again: now a cache hit
Hca3: -f l -s {Hca3.lid} -d {Hca4.lid}
# by GID, across both switches
Hca2: -f g -s {Hca2.gid} -d {Hca4.gid} -v
# host names and IP addresses from the hosts file
Hca3: -f n -s {Hca3.name} -d {Hca4.name} -v
Hca4: -f i -s {Hca4.ipv4} -d {Hca2.ipv4} -v
Hca4: -f i -s {Hca4.ipv6} -d {Hca3.ipv6} -v
# the provider's counters for Hca3's endpoint (route queries vs route cache hits)
Hca3: -P 1
# the port goes down and comes back; nothing learned before is served stale
port-down Hca3
port-up Hca3
Hca3: -f l -s {Hca3.lid} -d {Hca4.lid} -v
STEPS

# A mixed fabric: every daemon loads its own provider (each node's ibacm_opts.cfg names its
# provider and provider_lib_path), and there is no hosts file (--hosts-file none): a daemon
# knows only its own name and IPs, the rest must come over the ACM address protocol.
echo "=== mixed fabric ($MIXED), no hosts file: each daemon's provider, LID/GID paths from every node"
"$BIN/acm-fabric" script --provider "$MIXED" --nodes Hca2,Hca3,Hca4 --hosts-file none \
  --name-prefix main-mixed --retry 10 scripts/main-mixed-lids.script

echo "=== names, IPv4, IPv6 with no hosts file (scripts/main-mixed.script), all stock"
"$BIN/acm-fabric" script --provider stock --nodes Hca2,Hca3,Hca4 --hosts-file none \
  --name-prefix main-stock --retry 10 scripts/main-mixed.script

echo "=== names, IPv4, IPv6 across providers ($MIXED), no hosts file (scripts/main-mixed.script)"
"$BIN/acm-fabric" script --provider "$MIXED" --nodes Hca2,Hca3,Hca4 --hosts-file none \
  --name-prefix main-mixed-names --retry 10 scripts/main-mixed.script
# Partitions (OpenSM partitions.conf): each daemon gets one endpoint per P_Key with its own
# addresses there; short ACM timeouts so the refused steps fail in well under a second.
echo "=== partitions 0x8001 (Hca2, Hca3) and 0x8003 (Hca3, Hca4), $MIXED, no hosts file (scripts/main-partitions.script)"
"$BIN/acm-fabric" script --provider "$MIXED" --nodes Hca2,Hca3,Hca4 --hosts-file none \
  --partition 0x8001:Hca2,Hca3 --partition 0x8003:Hca3,Hca4 \
  --opt timeout=300 --opt retries=1 --subnet-timeout 8 \
  --name-prefix main-partitions --retry 10 scripts/main-partitions.script
# Hosts as they are built: two HCAs of one port each, a dual-port HCA with a port on each of two
# subnets (a second ibsim + OpenSM, prefix fec0:0:0:2::/64), a dual-port HCA on one subnet.
echo "=== hosts of several HCAs and ports, two subnets, $MIXED, no hosts file (scripts/main-hosts.script)"
"$BIN/acm-fabric" script --topology fattree:2,1,4 --sm-node Hca1 --nodes Hca2,Hca3,Hca4 \
  --provider "$MIXED" --host Hca2=Hca2,Hca6 --host Hca3=Hca3+s2:Hca3 --host Hca4=Hca4+Hca7 \
  --subnet s2=net.2sw2path4hca@Hca1 --hosts-file none \
  --name-prefix main-hosts --retry 10 scripts/main-hosts.script
echo "=== done: every fabric process was stopped and its scratch directory removed"
