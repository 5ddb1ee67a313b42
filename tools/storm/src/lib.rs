//! A job start-up storm in virtual time, over the real resolver (see `docs/storm.md`).
//!
//! N nodes (one endpoint each, [`acm_core_nostd::sim`] in scale mode)
//! each resolve k peers by LID or GID (RESOLVE PATH requests, every one a miss that needs an SA
//! PathRecord query) against one SA server, OpenSM as measured (a service time per Get, one
//! dispatcher FIFO, silent drops past `max_msg_fifo_timeout`, no BUSY unless asked for;
//! [`SaService`]). A node's client keeps `concurrency` requests outstanding; a request that
//! fails is issued again after `client_retry` (what an MPI start-up does with a failed
//! `rdma_resolve_route`). Two resolver configurations: [`Profile::Acmrs`] (`Config::default()`)
//! and [`Profile::IbacmpLike`] ([`ibacmp_like`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use acm_core_nostd::cache::PathSlot;
use acm_core_nostd::node::{SaConfig, Transport};
use acm_core_nostd::resolver::{Capacities, Config, Kind, Millis};
use acm_core_nostd::sim::ud::SmPortStats;
use acm_core_nostd::sim::{
    gid_msg, lid_msg, node_gid, node_lid, Rng, SaService, SaServiceStats, Sim, SimConfig,
};
use acm_core_nostd::wire::client::Status;
use acm_core_nostd::wire::path_record::PathRecord;

/// Which resolver configuration the nodes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    /// acmrs as shipped: `Config::default()`.
    Acmrs,
    /// The same resolver set up to behave as ibacmp under the ibacm core ([`ibacmp_like`]).
    IbacmpLike,
}

impl Profile {
    /// The name in tables and plots.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Acmrs => "acmrs (defaults)",
            Profile::IbacmpLike => "ibacmp-like",
        }
    }

    /// How its SA MADs travel: acmrs's default `ud` transport (its SA channel, on the ports'
    /// own QPs), ibacmp's the core's umad service.
    pub fn transport(self) -> Transport {
        match self {
            Profile::Acmrs => Transport::Ud,
            Profile::IbacmpLike => Transport::Core,
        }
    }

    /// The resolver configuration.
    pub fn config(self) -> Config {
        match self {
            Profile::Acmrs => Config::default(),
            Profile::IbacmpLike => ibacmp_like(),
        }
    }
}

/// ibacmp's behaviour expressed as resolver settings (sources in `docs/storm.md`):
///
/// * one SA query in flight per node: the core's `sa_depth` 1 (`sa_window = 1`);
/// * no deadline of its own: ibacmp waits for the core's completion, which comes from the
///   kernel MAD layer after `timeout × (retries + 1)` (modelled by [`SaService`]), so the
///   resolver's SA and queue deadlines are set out of the way (1 h);
/// * BUSY is not retried: ibacmp reads only the class status byte (`status >> 8`), so BUSY
///   (common status bit 0) never leads to a retry; the request completes at once
///   (`sa_busy_retries = 0`: answered ETIMEDOUT at the first BUSY, see `docs/storm.md` for
///   why a failure is the charitable reading);
/// * no negative cache (`negative_ttl = 0`) and one multicast resolve in flight
///   (`acm_window = 1`, `resolve_depth`), neither of which a PATH storm exercises;
/// * one Get per path: ibacmp never asks for a half-world table (`sa_tables = false`).
pub fn ibacmp_like() -> Config {
    Config {
        sa_window: 1,
        sa_busy_retries: 0,
        sa_deadline: 3_600_000,
        queue_deadline: 3_600_000,
        negative_ttl: 0,
        acm_window: 1,
        // The core's SA service: no Reports come.
        sa_reports: false,
        sa_tables: false,
        sa_table_min: 0,
        ..Config::default()
    }
}

/// How the k destinations of a node are picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peers {
    /// Nodes `i + 1 … i + k` (mod N).
    Ring,
    /// k distinct other nodes at random (seeded).
    Random,
}

/// How a destination is named in the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dest {
    /// PATH with DLID.
    Lid,
    /// PATH with DGID.
    Gid,
}

/// One run.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Nodes.
    pub nodes: usize,
    /// Destinations per node.
    pub peers: usize,
    /// How they are picked.
    pub pick: Peers,
    /// LID or GID requests.
    pub dest: Dest,
    /// Requests a node's clients keep outstanding.
    pub concurrency: usize,
    /// A failed request is issued again this long after its answer (ms).
    pub client_retry: Millis,
    /// The SA server and the MAD layer.
    pub sa: SaService,
    /// The resolver configuration.
    pub profile: Profile,
    /// How the nodes' SA MADs travel ([`Profile::transport`] unless changed).
    pub transport: Transport,
    /// Seed of everything.
    pub seed: u64,
    /// Give up at this virtual time (ms).
    pub horizon: Millis,
    /// Check every touched resolver's invariants after every step (slow; tests).
    pub checks: bool,
    /// Count the SA's queries per (node, destination).
    pub per_dest: bool,
    /// Path cache entries per node (`None`: [`Params::cache_entries`]'s default).
    pub cache: Option<usize>,
}

/// Path cache entries over all nodes up to which each node gets a cache that holds its whole
/// half-world table (about 1.2 GiB of simulator memory).
pub const CACHE_ENTRIES_BUDGET: usize = 8 << 20;

impl Params {
    /// Path cache entries per node: the chosen figure, else room for a half-world table filed
    /// by LID and by GID plus the peers (`2N + k`, as a plugin with the default
    /// `acmrs_path_capacity` 65 536 has up to N = 32 768) while all nodes' caches stay within
    /// [`CACHE_ENTRIES_BUDGET`], else only the peers (`k`: then a table does not fit and is
    /// refused, and acmrs resolves by Gets).
    pub fn cache_entries(&self) -> usize {
        let whole = 2 * self.nodes + self.peers;
        self.cache
            .unwrap_or(if whole * self.nodes <= CACHE_ENTRIES_BUDGET {
                whole
            } else {
                self.peers
            })
    }

    /// `nodes` × `peers` ring, LID, 64 outstanding per node, 1 s client retry, the default SA.
    pub fn new(nodes: usize, peers: usize, profile: Profile) -> Params {
        Params {
            nodes,
            peers,
            pick: Peers::Ring,
            dest: Dest::Lid,
            concurrency: 64,
            client_retry: 1000,
            sa: SaService::DEFAULT,
            profile,
            transport: profile.transport(),
            seed: 1,
            horizon: 3_600_000,
            checks: false,
            per_dest: true,
            cache: None,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// The parameters.
    pub params: Params,
    /// Virtual time at which every node had all its paths (None: not within the horizon).
    pub all_done: Option<Millis>,
    /// Per-node completion times (ms), sorted; nodes that did not finish are absent.
    pub node_done: Vec<Millis>,
    /// When each (node, peer) pair was resolved (ms), sorted.
    pub pair_done: Vec<Millis>,
    /// Requests the clients issued (first tries and re-issues).
    pub issued: u64,
    /// Answers with a non-zero status (each one re-issued).
    pub failed: u64,
    /// Answers whose path does not lead to the requested peer.
    pub wrong: u64,
    /// SA queries the resolvers handed to the core (`SendSa` PathRecord GETs).
    pub sa_queries: u64,
    /// The SA model's view.
    pub sa: SaServiceStats,
    /// What the SM's port sent and took in on the `ud` transport (RMPP segments, ACKs).
    pub sm_port: SmPortStats,
    /// Most SA queries the SA accepted for one (node, destination).
    pub per_dest_max: u32,
    /// (node, destination) pairs the SA served more than once.
    pub per_dest_repeats: u64,
    /// Resolver ETIMEDOUT answers (all nodes).
    pub resolver_timeouts: u64,
    /// Half-world tables the resolvers received, and those that failed.
    pub tables: (u64, u64),
    /// Exactly-once and bookkeeping violations the simulator found.
    pub violations: Vec<String>,
    /// Requests never answered at the end.
    pub unanswered: usize,
    /// Wall-clock time of the run (s).
    pub wall_s: f64,
}

impl Report {
    /// The per-node completion quantile `q` (0..=1), ms.
    pub fn node_quantile(&self, q: f64) -> Option<Millis> {
        quantile(&self.node_done, q)
    }
}

/// The `q` quantile of sorted `v` (nearest rank).
pub fn quantile(v: &[Millis], q: f64) -> Option<Millis> {
    if v.is_empty() {
        return None;
    }
    let r = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[r - 1])
}

/// The destinations of node `i`.
fn peers_of(p: &Params, i: usize, rng: &mut Rng) -> Vec<u32> {
    let n = p.nodes;
    match p.pick {
        Peers::Ring => (1..=p.peers).map(|d| ((i + d) % n) as u32).collect(),
        Peers::Random => {
            let mut seen = std::collections::HashSet::new();
            let mut v = Vec::with_capacity(p.peers);
            while v.len() < p.peers {
                let j = rng.below(n as u64) as usize;
                if j != i && seen.insert(j) {
                    v.push(j as u32);
                }
            }
            v
        }
    }
}

/// The simulator configuration of a run: tables sized to the run (k cache entries, the
/// client's outstanding requests), so 10 000 resolvers fit in memory.
pub fn sim_config(p: &Params) -> SimConfig {
    let mut c = SimConfig::new(p.nodes, p.seed);
    c.resolver = p.profile.config();
    // The core's `timeout` and `retries`, which the MAD layer uses over the core's service,
    // are the SA channel's per-try wait and tries on the `ud` transport.
    c.sa = SaConfig {
        transport: p.transport,
        tries: p.sa.umad_retries + 1,
        try_wait: p.sa.umad_timeout,
        // Over the core's service the profile's window is the core's `sa_depth` (ibacmp-like:
        // 1); the model's own credits are `--core-sa-depth`.
        core_depth: c.resolver.sa_window,
    };
    let conc = p.concurrency.min(p.peers).max(1);
    c.caps = Capacities {
        requests: conc + 8,
        answer_reserve: 8,
        jobs: conc,
        sa_inflight: 256,
        addrs: 16,
        endpoints: 2,
        preloads: 1,
    };
    let entries = p.cache_entries();
    c.cache_slots = PathSlot::slots_for(entries);
    // The plugin's table slot holds half its path capacity (a record is filed twice).
    c.table_room = entries / 2;
    c.resolver.sa_table_room = c.resolver.sa_table_room.min(c.table_room as u32);
    c.addr_cache_slots = Some(64);
    c.sa_service = Some(p.sa);
    c.scale = true;
    c.checks = p.checks;
    c.count_per_dest = p.per_dest;
    c
}

/// Runs one storm.
pub fn run(p: Params) -> Report {
    assert!(p.peers < p.nodes, "k must be below N");
    let t0 = std::time::Instant::now();
    let mut sim = Sim::new(sim_config(&p));
    let mut rng = Rng(p.seed ^ 0x5157_0a4d);
    let n = p.nodes;
    let conc = p.concurrency.min(p.peers).max(1);
    let peers: Vec<Vec<u32>> = (0..n).map(|i| peers_of(&p, i, &mut rng)).collect();
    let mut cursor = vec![0usize; n];
    let mut done = vec![0usize; n];
    let mut node_done = Vec::with_capacity(n);
    let mut pair_done = Vec::with_capacity(n * p.peers);
    let mut clients: HashMap<u64, (u32, u32)> = HashMap::new();
    let mut retry: BinaryHeap<Reverse<(Millis, u32, u32)>> = BinaryHeap::new();
    let (mut issued, mut failed, mut wrong) = (0u64, 0u64, 0u64);
    let dest = p.dest;
    let issue = |sim: &mut Sim, clients: &mut HashMap<u64, (u32, u32)>, i: usize, peer: u32| {
        let to = peer as usize;
        let c = sim.request(i, Kind::Resolve, |tid| match dest {
            Dest::Lid => lid_msg(node_lid(to), false, tid),
            Dest::Gid => gid_msg(node_gid(to), false, tid),
        });
        clients.insert(c, (i as u32, peer));
    };
    // Job start: every node's clients issue their first requests at t = 0.
    for i in 0..n {
        while cursor[i] < conc {
            let peer = peers[i][cursor[i]];
            cursor[i] += 1;
            issued += 1;
            issue(&mut sim, &mut clients, i, peer);
        }
    }
    let mut remaining = n;
    while remaining > 0 {
        let next = match (sim.next_time(), retry.peek().map(|r| r.0 .0)) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => break,
            },
        };
        if next > p.horizon {
            break;
        }
        sim.run_until(next);
        // Answers issue the next requests, whose answers (hits, answered inline) come at the
        // same virtual time: take them until there are none, not at the next event.
        loop {
            let answers = sim.take_answers();
            if answers.is_empty() {
                break;
            }
            for a in answers {
                let Some((i, peer)) = clients.remove(&a.client) else {
                    continue;
                };
                let iu = i as usize;
                if a.status != Status::Success {
                    failed += 1;
                    retry.push(Reverse((a.at + p.client_retry, i, peer)));
                    continue;
                }
                let ok = a.path.is_some_and(|r| {
                    let r = PathRecord::new_unchecked(&r[..]);
                    r.dlid() == node_lid(peer as usize) && r.dgid() == node_gid(peer as usize)
                });
                if !ok {
                    wrong += 1;
                }
                pair_done.push(a.at);
                done[iu] += 1;
                if done[iu] == p.peers {
                    node_done.push(a.at);
                    remaining -= 1;
                }
                if cursor[iu] < p.peers {
                    let peer = peers[iu][cursor[iu]];
                    cursor[iu] += 1;
                    issued += 1;
                    issue(&mut sim, &mut clients, iu, peer);
                }
            }
        }
        while retry.peek().is_some_and(|r| r.0 .0 <= sim.now) {
            let Some(Reverse((_, i, peer))) = retry.pop() else {
                break;
            };
            issued += 1;
            issue(&mut sim, &mut clients, i as usize, peer);
        }
    }
    sim.check_all();
    node_done.sort_unstable();
    pair_done.sort_unstable();
    let resolver_timeouts = sim.nodes.iter().map(|x| x.stats().timeouts).sum();
    let tables = sim.nodes.iter().fold((0, 0), |(a, b), x| {
        let s = x.stats();
        (a + s.sa_tables, b + s.sa_table_failed)
    });
    let per_dest_max = sim.sa_stats.per_dest.values().copied().max().unwrap_or(0);
    let per_dest_repeats = sim.sa_stats.per_dest.values().filter(|&&v| v > 1).count() as u64;
    let all_done = (node_done.len() == n).then(|| node_done.last().copied().unwrap_or(0));
    let mut sa = std::mem::take(&mut sim.sa_stats);
    sa.per_dest = HashMap::new();
    // The `ud` transport's tries are the nodes' SA channels' (0 over the core's service).
    sa.umad_timeouts += sim.nodes.iter().map(|x| x.node.sa().timeouts).sum::<u64>();
    Report {
        params: p,
        all_done,
        node_done,
        pair_done,
        issued,
        failed,
        wrong,
        sa_queries: sim.sa_queries,
        per_dest_max,
        per_dest_repeats,
        resolver_timeouts,
        tables,
        unanswered: sim.unanswered().len(),
        violations: std::mem::take(&mut sim.violations),
        sa,
        sm_port: sim.sm_port,
        wall_s: t0.elapsed().as_secs_f64(),
    }
}

/// Peak resident set size of this process (bytes), from `/proc/self/status` `VmHWM`.
pub fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Milliseconds as seconds with 3 decimals, or "—".
pub fn secs(ms: Option<Millis>) -> String {
    match ms {
        Some(v) => format!("{:.3}", v as f64 / 1000.0),
        None => "—".into(),
    }
}

/// The result table of some reports (Markdown, readable as text).
pub fn table(reports: &[Report]) -> String {
    let mut t = acm_report::Table::new(&[
        "configuration",
        "N",
        "k",
        "all done (s)",
        "node p50 (s)",
        "node p99 (s)",
        "node max (s)",
        "SA queries",
        "tables (failed)",
        "per pair",
        "max/pair",
        "SA sent (+retx)",
        "served",
        "peak queue",
        "peak wait (s)",
        "BUSY",
        "dropped",
        "umad timeouts",
        "late replies",
        "SM port MADs",
        "SM port: queries / segments / ACKs",
        "SM port wait (ms)",
        "failed",
        "wall (s)",
    ]);
    for r in reports {
        let pairs = (r.params.nodes * r.params.peers) as f64;
        t.row(vec![
            r.params.profile.name().into(),
            r.params.nodes.to_string(),
            r.params.peers.to_string(),
            secs(r.all_done),
            secs(r.node_quantile(0.5)),
            secs(r.node_quantile(0.99)),
            secs(r.node_done.last().copied()),
            r.sa_queries.to_string(),
            format!("{} ({})", r.tables.0, r.tables.1),
            format!("{:.3}", r.sa_queries as f64 / pairs),
            r.per_dest_max.to_string(),
            format!("{} (+{})", r.sa.sent, r.sa.retransmits),
            r.sa.served.to_string(),
            r.sa.peak_queue.to_string(),
            format!("{:.3}", r.sa.peak_wait_us as f64 / 1e6),
            r.sa.busy.to_string(),
            r.sa.dropped.to_string(),
            r.sa.umad_timeouts.to_string(),
            r.sa.late.to_string(),
            (r.sa.sm_port_in + r.sa.sm_port_out).to_string(),
            format!(
                "{} / {} / {}",
                r.sa.sm_port_in - r.sm_port.acks,
                r.sm_port.segments,
                r.sm_port.acks
            ),
            r.sa.sm_port_peak_wait_ms.to_string(),
            r.failed.to_string(),
            format!("{:.1}", r.wall_s),
        ]);
    }
    t.render()
}
