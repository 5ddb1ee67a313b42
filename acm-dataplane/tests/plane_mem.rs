//! The dataplane loop over in-memory IO: two [`Plane`]s (two nodes) whose UD QPs are an
//! in-memory network and whose core is a fake (an SA that answers PathRecord GETs and
//! MCMemberRecord SETs, a list of client answers). The same loop the provider runs over
//! verbs and the ibacm core; here the rounds are driven by hand, so nothing depends on timing.

use acm_core_nostd::cache::{
    ep_number, AddrKind, AddrSlot, CacheConfig, CacheWriter, PathCache, PathSlot,
};
use acm_core_nostd::node::SaConfig;
use acm_core_nostd::resolver::{
    AcmDest, Answer, Capacities, Config, Counter, EpConfig, EpId, HeapStorage, Kind, McGroup,
    MsgBuf, RecvMeta, Request, Resolver,
};
use acm_core_nostd::sim::{lid_msg, name_bytes, name_msg, node_ep_config, node_gid, node_lid};
use acm_core_nostd::wire::client::Status;
use acm_core_nostd::wire::path_record::PathRecord;
use acm_dataplane::plane::{
    Control, CoreIo, HostCache, HostWriter, Inbox, Plane, SaReply, SendError, Ud,
};
use acm_dataplane::worker::{Poller, Worker};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Datagrams in flight: (to node, meta, MAD).
type Wire = Arc<Mutex<VecDeque<(usize, RecvMeta, [u8; 256])>>>;

/// Node `i`'s UD QP on the in-memory network (two nodes: 0 and 1).
struct MemUd {
    me: usize,
    wire: Wire,
    attached: bool,
    watch: Arc<Overlap>,
}

/// Counts calls into a QP that overlap in time (two threads inside it at once).
#[derive(Default)]
struct Overlap {
    inside: std::sync::atomic::AtomicUsize,
    overlaps: std::sync::atomic::AtomicUsize,
    calls: std::sync::atomic::AtomicUsize,
    threads: Mutex<std::collections::HashSet<std::thread::ThreadId>>,
}

impl Overlap {
    /// Runs `f` as one call into the QP.
    fn call<R>(&self, f: impl FnOnce() -> R) -> R {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.fetch_add(1, SeqCst);
        self.threads
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
        if self.inside.fetch_add(1, SeqCst) != 0 {
            self.overlaps.fetch_add(1, SeqCst);
        }
        // Widen the window an overlap would need.
        std::thread::yield_now();
        let r = f();
        self.inside.fetch_sub(1, SeqCst);
        r
    }
}

/// A request handed over as a caller without a front does (no stamp, not classified), under
/// the endpoint's cache number at generation 0 (no test here reregisters).
trait HandPlain {
    fn request(&self, ep: EpId, client: u64, kind: Kind, msg: &[u8]) -> bool;
}

impl HandPlain for Inbox {
    fn request(&self, ep: EpId, client: u64, kind: Kind, msg: &[u8]) -> bool {
        let cache_ep = ep_number(0, ep.0);
        self.hand_over(&Request::new(ep, cache_ep, client, kind, msg), None)
    }
}

impl Ud for MemUd {
    fn send(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), SendError> {
        let watch = self.watch.clone();
        watch.call(|| self.send_now(to, mad))
    }

    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize {
        let watch = self.watch.clone();
        watch.call(|| self.poll_now(f))
    }

    fn attach(&mut self, _group: &McGroup) -> Result<(), String> {
        self.attached = true;
        Ok(())
    }

    fn detach(&mut self, _group: &McGroup) {
        self.attached = false;
    }

    fn arm(&mut self) -> Option<RawFd> {
        None
    }

    fn ack_events(&mut self) {}
}

impl MemUd {
    fn send_now(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), SendError> {
        let meta = RecvMeta {
            slid: node_lid(self.me),
            src_qp: 100 + self.me as u32,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
            ep_pkey_index: 0,
            grh_sgid: Some(node_gid(self.me)),
        };
        let to = match to {
            AcmDest::Group(_) if self.attached => 1 - self.me,
            AcmDest::Group(g) => return Err(SendError::UnknownGroup(*g)),
            AcmDest::Unicast(av) => (0..2)
                .find(|&j| node_lid(j) == av.dlid)
                // No such LID: lost on the fabric, as a real send would be.
                .ok_or(SendError::Verbs(acm_dataplane::verbs::VerbsError {
                    call: "ibv_post_send",
                    errno: 113, // EHOSTUNREACH
                }))?,
        };
        self.wire.lock().unwrap().push_back((to, meta, *mad));
        Ok(())
    }

    fn poll_now(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize {
        let mut mine = Vec::new();
        self.wire.lock().unwrap().retain(|(to, m, b)| {
            if *to == self.me {
                mine.push((*m, *b));
                false
            } else {
                true
            }
        });
        for (m, b) in &mine {
            f(m, b);
        }
        mine.len()
    }
}

/// An answer the fake core was given, with its message.
#[derive(Clone, Debug)]
struct Got {
    a: Answer,
    msg: Vec<u8>,
}

impl std::ops::Deref for Got {
    type Target = Answer;
    fn deref(&self) -> &Answer {
        &self.a
    }
}

/// What the fake core saw and did.
#[derive(Default)]
struct CoreLog {
    answers: Vec<Got>,
    sa_sent: usize,
    /// GetTables the core was asked to send (it reads one MAD per answer: never).
    get_tables: usize,
    counts: Vec<Counter>,
    logs: Vec<String>,
    /// Faults: the next SA send panics; so do the next `panic_logs` log calls and the next
    /// `panic_answers` answers (each panic takes one).
    panic_sa: bool,
    panic_logs: u32,
    panic_answers: u32,
}

/// Takes one armed fault of `pick`'s counter; the caller panics (after the lock is released,
/// so the log is not poisoned) if there was one.
fn fault(log: &Mutex<CoreLog>, pick: fn(&mut CoreLog) -> &mut u32) -> bool {
    let mut l = log.lock().unwrap();
    let c = pick(&mut l);
    let armed = *c > 0;
    *c = c.saturating_sub(1);
    armed
}

/// Node `me`'s fake core: answers SA MADs into the plane's inbox at once.
struct FakeCore {
    me: usize,
    inbox: Arc<Inbox>,
    log: Arc<Mutex<CoreLog>>,
    /// Fail every SA send (the resolver must answer the waiters once anyway).
    refuse_sa: bool,
}

impl CoreIo for FakeCore {
    fn send_sa(&mut self, _ep: EpId, token: u64, mad: &[u8; 256]) -> bool {
        if self.refuse_sa {
            return false;
        }
        let armed = std::mem::take(&mut self.log.lock().unwrap().panic_sa);
        if armed {
            panic!("injected: SA send");
        }
        self.log.lock().unwrap().sa_sent += 1;
        if mad[3] == 0x12 {
            self.log.lock().unwrap().get_tables += 1;
        }
        let mut reply = *mad;
        reply[3] = 0x81;
        match u16::from_be_bytes([mad[16], mad[17]]) {
            0x0035 => {
                // PathRecord GET: the path to whichever node the record names.
                let q = PathRecord::new_unchecked(&mad[56..120]);
                let to = (0..2).find(|&j| node_lid(j) == q.dlid() || node_gid(j) == q.dgid());
                match to {
                    Some(to) => {
                        let mut p = PathRecord::new_unchecked(&mut reply[56..120]);
                        p.set_dgid(node_gid(to));
                        p.set_sgid(node_gid(self.me));
                        p.set_dlid(node_lid(to));
                        p.set_slid(node_lid(self.me));
                        p.set_reversible_numpath(true, 0);
                        p.set_pkey(0xffff);
                    }
                    None => reply[4..6].copy_from_slice(&0x0300u16.to_be_bytes()),
                }
            }
            // MCMemberRecord SET: one MLID for the one group.
            0x0038 => reply[92..94].copy_from_slice(&0xc001u16.to_be_bytes()),
            _ => reply[3] = mad[3] | 0x80,
        }
        self.inbox.reply(SaReply {
            token,
            umad_status: 0,
            mad: reply,
            handed: 0,
        });
        true
    }

    fn answer(&mut self, a: &Answer, msg: &mut MsgBuf) {
        if fault(&self.log, |l| &mut l.panic_answers) {
            panic!("injected: answer");
        }
        let got = Got {
            a: *a,
            msg: msg.message(a).to_vec(),
        };
        self.log.lock().unwrap().answers.push(got);
    }

    fn count(&mut self, _ep: EpId, c: Counter) {
        self.log.lock().unwrap().counts.push(c);
    }

    fn log(&mut self, _level: u8, text: &str) {
        if fault(&self.log, |l| &mut l.panic_logs) {
            panic!("injected: log");
        }
        self.log.lock().unwrap().logs.push(text.to_string());
    }

    fn log_enabled(&self, _level: u8) -> bool {
        true
    }
}

/// The resolver's defaults (the `ud` SA transport: Report subscriptions).
fn ud_sa_config() -> Config {
    let (o, _) = acm_core_nostd::text::opts::ProviderOptions::load(b"", |e| panic!("{e:?}"));
    Config::from_options(&o)
}

/// The resolver's defaults with the SA behind the core's service, as these loops have it (no
/// `with_sa`): no Report subscriptions.
fn core_sa_config() -> Config {
    let (o, _) =
        acm_core_nostd::text::opts::ProviderOptions::load(b"acmrs_sa_transport core\n", |e| {
            panic!("{e:?}")
        });
    Config::from_options(&o)
}

struct Node {
    plane: Plane<FakeCore>,
    inbox: Arc<Inbox>,
    log: Arc<Mutex<CoreLog>>,
}

fn node(me: usize, wire: &Wire, refuse_sa: bool) -> Node {
    node_with(me, wire, refuse_sa, usize::MAX)
}

/// The endpoint-open message of node `me` on `wire`.
fn open_msg(me: usize, wire: &Wire) -> Control {
    open_watched(me, wire, Arc::default())
}

/// [`open_msg`] with the QP's calls counted by `watch`.
fn open_watched(me: usize, wire: &Wire, watch: Arc<Overlap>) -> Control {
    Control::Open {
        ep: EpId(0),
        cache_ep: ep_number(0, 0),
        cfg: EpConfig {
            sa_pkey: true,
            ..node_ep_config(me)
        },
        ud: Some(Box::new(MemUd {
            me,
            wire: wire.clone(),
            attached: false,
            watch,
        })),
        routes: Vec::new(),
        addrs: Arc::new(Vec::new()),
    }
}

/// A node whose plane can build `resolvers` resolvers (the first at start, the rest after
/// caught panics).
fn node_with(me: usize, wire: &Wire, refuse_sa: bool, resolvers: usize) -> Node {
    node_watched(me, wire, refuse_sa, resolvers, Arc::default())
}

/// [`node_with`], the calls into its QP counted by `watch`.
fn node_watched(
    me: usize,
    wire: &Wire,
    refuse_sa: bool,
    resolvers: usize,
    watch: Arc<Overlap>,
) -> Node {
    let n = bare_node(me, core_sa_config(), refuse_sa, resolvers, false);
    n.inbox.control(open_watched(me, wire, watch));
    n.inbox.control(Control::AddAddress {
        ep: EpId(0),
        cache_ep: ep_number(0, 0),
        kind: AddrKind::Name,
        addr: name_bytes(&format!("node{me}")),
    });
    n
}

/// A node with no endpoint yet, its resolvers built from `cfg`; `ud_sa`: the plane sends SA
/// MADs from the endpoints' UD QPs.
fn bare_node(me: usize, cfg: Config, refuse_sa: bool, resolvers: usize, ud_sa: bool) -> Node {
    let waker = Worker::new_waker();
    let inbox = Arc::new(Inbox::new(64, 64, waker.clone()));
    let cache: Arc<HostCache> = Arc::new(
        PathCache::new(
            PathSlot::boxed(256),
            AddrSlot::boxed(64),
            CacheConfig::default(),
        )
        .unwrap(),
    );
    let log = Arc::new(Mutex::new(CoreLog::default()));
    let core = FakeCore {
        me,
        inbox: inbox.clone(),
        log: log.clone(),
        refuse_sa,
    };
    let caps = Capacities {
        requests: 64,
        answer_reserve: 4,
        jobs: 16,
        sa_inflight: 8,
        addrs: 32,
        endpoints: 4,
        preloads: 4,
    };
    let left = std::sync::atomic::AtomicUsize::new(resolvers);
    let make = Box::new(move |w: HostWriter| {
        let n = left.load(std::sync::atomic::Ordering::Relaxed);
        left.store(n.saturating_sub(1), std::sync::atomic::Ordering::Relaxed);
        (n > 0)
            .then(|| Resolver::new(cfg, HeapStorage::new(caps), w, 7).ok())
            .flatten()
    });
    let writer = CacheWriter::take(cache).unwrap();
    let mut plane = Plane::new(make, writer, inbox.clone(), core, waker.epoch()).unwrap();
    if ud_sa {
        plane = plane.with_sa(SaConfig::default(), 16, 1024);
    }
    Node { plane, inbox, log }
}

/// Runs rounds of both planes until `done` holds (bounded: the loop is deterministic, so a
/// few hundred rounds are plenty; the wall-clock bound only catches a livelock).
fn run(nodes: &mut [Node], done: impl Fn(&[Node]) -> bool) -> bool {
    let t0 = Instant::now();
    for _ in 0..10_000 {
        for n in nodes.iter_mut() {
            n.plane.poll(Instant::now());
        }
        if done(nodes) {
            return true;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    false
}

fn answers(n: &Node) -> Vec<Got> {
    n.log.lock().unwrap().answers.clone()
}

fn dlid_of(a: &Got) -> u16 {
    PathRecord::new_unchecked(&a.msg[24..88]).dlid()
}

#[test]
fn a_name_resolves_across_two_planes_over_the_in_memory_network() {
    let wire: Wire = Arc::default();
    let mut nodes = [node(0, &wire, false), node(1, &wire, false)];
    let msg = name_msg("node1", Some("node0"), false, 0x77);
    assert!(nodes[0].inbox.request(EpId(0), 5, Kind::Resolve, &msg));
    assert!(run(&mut nodes, |n| !answers(&n[0]).is_empty()));
    let a = answers(&nodes[0]);
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].client, a[0].status), (5, Status::Success));
    assert_eq!(
        u64::from_ne_bytes(a[0].msg[8..16].try_into().unwrap()),
        0x77
    );
    assert_eq!(dlid_of(&a[0]), node_lid(1));
    let c = nodes[0].log.lock().unwrap().counts.clone();
    assert!(
        c.contains(&Counter::AddrQuery) && c.contains(&Counter::RouteQuery),
        "{c:?}"
    );
    // The peer answered over the network and the requester sent the SA its own query.
    assert!(
        nodes[0].log.lock().unwrap().sa_sent >= 2,
        "join + PathRecord"
    );
    // Nothing more arrives: exactly one answer.
    run(&mut nodes, |_| false);
    assert_eq!(answers(&nodes[0]).len(), 1);
}

#[test]
fn requests_and_control_messages_keep_the_main_threads_order() {
    let wire: Wire = Arc::default();
    let mut nodes = [node(0, &wire, false), node(1, &wire, false)];
    run(&mut nodes, |_| false);
    // A request for node1's name, then the endpoint is closed and opened again, all queued
    // before the loop runs (as the core's main thread can do between two rounds). The request
    // belongs to the endpoint that was closed: it is answered ENODATA by the close, not
    // resolved over the reopened endpoint (which a loop applying control messages first
    // would do).
    let msg = name_msg("node1", Some("node0"), false, 0x51);
    assert!(nodes[0].inbox.request(EpId(0), 7, Kind::Resolve, &msg));
    nodes[0].inbox.control(Control::Close(EpId(0)));
    nodes[0].inbox.control(open_msg(0, &wire));
    nodes[0].inbox.control(Control::AddAddress {
        ep: EpId(0),
        cache_ep: ep_number(0, 0),
        kind: AddrKind::Name,
        addr: name_bytes("node0"),
    });
    // And an address added before a request is in effect for it.
    nodes[0].inbox.control(Control::AddAddress {
        ep: EpId(0),
        cache_ep: ep_number(0, 0),
        kind: AddrKind::Name,
        addr: name_bytes("alias0"),
    });
    let alias = name_msg("alias0", Some("node0"), false, 0x52);
    assert!(nodes[0].inbox.request(EpId(0), 8, Kind::Resolve, &alias));
    assert!(run(&mut nodes, |n| answers(&n[0]).len() == 2));
    run(&mut nodes, |_| false);
    let a = answers(&nodes[0]);
    assert_eq!(a.len(), 2, "one answer each");
    let by = |c: u64| a.iter().find(|a| a.client == c).unwrap();
    assert_eq!(
        by(7).status,
        Status::Enodata,
        "the closed endpoint's request: ENODATA"
    );
    assert_eq!(
        (by(8).status, dlid_of(by(8))),
        (Status::Success, node_lid(0)),
        "loopback of the new address"
    );
}

#[test]
fn a_burst_of_requests_from_one_peer_gets_every_response() {
    let wire: Wire = Arc::default();
    let mut nodes = [node(0, &wire, false), node(1, &wire, false)];
    nodes[0].inbox.control(Control::AddAddress {
        ep: EpId(0),
        cache_ep: ep_number(0, 0),
        kind: AddrKind::Name,
        addr: name_bytes("alias0"),
    });
    // Let both join their group first.
    run(&mut nodes, |_| false);
    // node1 asks for both of node0's names in one round: node0 receives both requests in
    // one burst from its QP and owes node1 two responses.
    for (c, name) in [(1u64, "node0"), (2, "alias0")] {
        let m = name_msg(name, Some("node1"), false, 0x60 + c);
        assert!(nodes[1].inbox.request(EpId(0), c, Kind::Resolve, &m));
    }
    // Without a retry: the clock stands still (node1's first retry is 2 s away), so only the
    // first responses can answer them.
    let frozen = Instant::now();
    let answered = (0..10_000).any(|_| {
        for n in nodes.iter_mut() {
            n.plane.poll(frozen);
        }
        answers(&nodes[1]).len() == 2
    });
    assert!(
        answered,
        "{:?}",
        answers(&nodes[1])
            .iter()
            .map(|a| (a.client, a.status))
            .collect::<Vec<_>>()
    );
    for a in answers(&nodes[1]) {
        assert_eq!((a.status, dlid_of(&a)), (Status::Success, node_lid(0)));
    }
}

#[test]
fn without_a_resolver_every_request_is_still_answered_once() {
    let wire: Wire = Arc::default();
    // One resolver only: after the panic none can be built.
    let mut nodes = [node_with(0, &wire, false, 1)];
    run(&mut nodes, |_| false);
    assert!(nodes[0]
        .inbox
        .request(EpId(0), 1, Kind::Resolve, &lid_msg(9, false, 1)));
    nodes[0].plane.poll(Instant::now());
    nodes[0].plane.recover("injected");
    assert!(nodes[0].inbox.is_stopped());
    // A stopped loop takes no more requests: the provider answers them at once (ENODATA).
    assert!(!nodes[0]
        .inbox
        .request(EpId(0), 2, Kind::Resolve, &lid_msg(9, false, 2)));
    assert!(!nodes[0]
        .inbox
        .request(EpId(0), 3, Kind::Query, &lid_msg(9, false, 3)));
    assert!(run(&mut nodes, |n| !answers(&n[0]).is_empty()));
    run(&mut nodes, |_| false);
    let got: Vec<(u64, Status)> = answers(&nodes[0])
        .iter()
        .map(|a| (a.client, a.status))
        .collect();
    assert_eq!(got, vec![(1, Status::Enodata)], "the one it held, once");
    nodes[0].inbox.control(Control::Shutdown);
    nodes[0].plane.poll(Instant::now());
    assert!(nodes[0].plane.finished());
}

#[test]
fn a_refused_sa_send_answers_the_waiters_once() {
    let wire: Wire = Arc::default();
    let mut nodes = [node(0, &wire, true)];
    for (c, tid) in [(1u64, 11u64), (2, 12)] {
        assert!(nodes[0]
            .inbox
            .request(EpId(0), c, Kind::Resolve, &lid_msg(9, false, tid)));
    }
    assert!(run(&mut nodes, |n| answers(&n[0]).len() == 2));
    run(&mut nodes, |_| false);
    let a = answers(&nodes[0]);
    assert_eq!(a.len(), 2, "one answer each");
    assert!(
        a.iter().all(|a| a.status != Status::Success),
        "{:?}",
        a.iter().map(|a| a.status).collect::<Vec<_>>()
    );
}

#[test]
fn no_half_world_table_goes_through_the_cores_service() {
    // The resolver's options say `ud` (tables on), but this plane sends SA MADs through the
    // core, which reads one MAD per answer: a backlog long enough for a table (24 misses of
    // 13 destinations, a window that starts at one) must not hand it a GetTable, and every
    // request is answered once by Gets.
    let wire: Wire = Arc::default();
    let cfg = Config {
        sa_table_min: 4,
        ..ud_sa_config()
    };
    assert!(cfg.sa_tables);
    let n = bare_node(0, cfg, false, usize::MAX, false);
    n.inbox.control(open_msg(0, &wire));
    let mut nodes = [n];
    run(&mut nodes, |_| false);
    for c in 0..24u64 {
        let lid = if c % 2 == 0 {
            node_lid(1)
        } else {
            500 + c as u16
        };
        assert!(nodes[0]
            .inbox
            .request(EpId(0), c, Kind::Resolve, &lid_msg(lid, false, c)));
    }
    assert!(run(&mut nodes, |n| answers(&n[0]).len() == 24));
    let a = answers(&nodes[0]);
    let mut clients: Vec<u64> = a.iter().map(|a| a.client).collect();
    clients.sort_unstable();
    assert_eq!(clients, (0..24).collect::<Vec<_>>(), "each once");
    for a in &a {
        let want = if a.client % 2 == 0 {
            Status::Success
        } else {
            Status::Enodata
        };
        assert_eq!(a.status, want, "client {}", a.client);
    }
    let log = nodes[0].log.lock().unwrap();
    assert_eq!(log.get_tables, 0);
    assert!(log.sa_sent >= 13, "Gets: {}", log.sa_sent);
}

/// Node 0 after one poll of client 1's name request for a peer that does not exist: a miss
/// the resolver holds (the name query retries).
fn holding_a_name_miss(wire: &Wire) -> Node {
    let mut n = node(0, wire, false);
    assert!(n.inbox.request(
        EpId(0),
        1,
        Kind::Resolve,
        &name_msg("nobody", None, false, 1)
    ));
    n.plane.poll(Instant::now());
    n
}

#[test]
fn shutdown_answers_everything_still_queued_exactly_once() {
    // A miss the resolver holds (the peer does not exist: the name query retries) and two
    // requests still in the queue when the shutdown arrives.
    let wire: Wire = Arc::default();
    let mut nodes = [holding_a_name_miss(&wire)];
    nodes[0].inbox.control(Control::Shutdown);
    assert!(nodes[0]
        .inbox
        .request(EpId(0), 2, Kind::Resolve, &lid_msg(1, false, 2)));
    assert!(nodes[0]
        .inbox
        .request(EpId(0), 3, Kind::Query, &lid_msg(1, false, 3)));
    nodes[0].plane.poll(Instant::now());
    assert!(nodes[0].plane.finished());
    let mut clients: Vec<u64> = answers(&nodes[0]).iter().map(|a| a.client).collect();
    clients.sort();
    assert_eq!(clients, vec![1, 2, 3]);
}

#[test]
fn a_panic_in_the_loop_restarts_the_resolver_and_answers_what_it_held() {
    let wire: Wire = Arc::default();
    let mut nodes = [holding_a_name_miss(&wire)];
    // The worker catches a panic of `poll` and calls `recover`: do the same by hand.
    nodes[0].plane.recover("injected");
    assert_eq!(
        answers(&nodes[0]).iter().filter(|a| a.client == 1).count(),
        1
    );
    assert!(nodes[0]
        .log
        .lock()
        .unwrap()
        .logs
        .iter()
        .any(|l| l.contains("panicked (injected)")));
    // The fresh resolver serves the same endpoint and addresses.
    let msg = name_msg("node0", Some("node0"), false, 5);
    assert!(nodes[0].inbox.request(EpId(0), 2, Kind::Resolve, &msg));
    assert!(run(&mut nodes, |n| answers(&n[0])
        .iter()
        .any(|a| a.client == 2)));
    let a = answers(&nodes[0]);
    let a2 = a.iter().find(|a| a.client == 2).unwrap();
    assert_eq!((a2.status, dlid_of(a2)), (Status::Success, node_lid(0)));
}

#[test]
fn garbage_from_the_wire_is_dropped_counted_and_logged() {
    let wire: Wire = Arc::default();
    let mut nodes = [node(0, &wire, false)];
    run(&mut nodes, |_| false);
    let meta = RecvMeta {
        slid: 9,
        src_qp: 77,
        sl: 0,
        dlid_path_bits: 0,
        pkey_index: 0,
        ep_pkey_index: 0,
        grh_sgid: Some(node_gid(1)),
    };
    // A class-0x2C MAD of the wrong class version, then one of another class altogether.
    let mut bad = [0u8; 256];
    bad[0] = 1;
    bad[1] = 0x2c;
    bad[2] = 9;
    bad[3] = 1;
    // One of the SA class that is a reply (R bit) to nothing we sent, and one that is not a
    // reply, so must be a valid Report, and is not.
    let mut other = [0xa5u8; 256];
    other[1] = 0x03;
    let mut not_report = [0u8; 256];
    not_report[..4].copy_from_slice(&[1, 3, 2, 0x06]);
    not_report[16..18].copy_from_slice(&[0x00, 0x35]);
    for m in [bad, other, not_report] {
        wire.lock().unwrap().push_back((0, meta, m));
    }
    let logged = |n: &[Node], what: &str| {
        n[0].log
            .lock()
            .unwrap()
            .logs
            .iter()
            .any(|l| l.contains(what))
    };
    // The class 3 ones come from LID 9, QP 77, not from an SM: dropped before anything
    // parses them.
    let all = |n: &[Node]| {
        logged(n, "malformed ACM MAD dropped: 1 (total 1)")
            && logged(n, "SA MAD not from the SM (its LID, QP 1) or not on the asking QP dropped: 2 (total 2)")
    };
    run(&mut nodes, all);
    let logs = nodes[0].log.lock().unwrap().logs.clone();
    assert!(all(&nodes), "{logs:?}");
    assert!(
        answers(&nodes[0]).is_empty(),
        "nothing answered for garbage"
    );
}

/// A UD QP that receives nothing and reports `health` as what it dropped so far.
struct SickUd(acm_dataplane::plane::UdHealth);

impl Ud for SickUd {
    fn send(&mut self, _to: &AcmDest, _mad: &[u8; 256]) -> Result<(), SendError> {
        Ok(())
    }
    fn poll(&mut self, _f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize {
        0
    }
    fn attach(&mut self, _group: &McGroup) -> Result<(), String> {
        Ok(())
    }
    fn detach(&mut self, _group: &McGroup) {}
    fn arm(&mut self) -> Option<RawFd> {
        None
    }
    fn ack_events(&mut self) {}
    fn health(&self) -> acm_dataplane::plane::UdHealth {
        self.0
    }
}

/// Endpoint `ep` (sim node 0's port) with a [`SickUd`] that dropped `short` short datagrams.
fn sick_open(ep: u8, short: u64) -> Control {
    Control::Open {
        ep: EpId(ep),
        cache_ep: ep_number(0, ep),
        cfg: EpConfig {
            sa_pkey: true,
            ..node_ep_config(0)
        },
        ud: Some(Box::new(SickUd(acm_dataplane::plane::UdHealth {
            short,
            ..Default::default()
        }))),
        routes: Vec::new(),
        addrs: Arc::new(Vec::new()),
    }
}

#[test]
fn a_qps_drops_are_logged_per_endpoint_and_a_reopened_endpoint_counts_afresh() {
    let mut n = bare_node(0, core_sa_config(), false, usize::MAX, false);
    n.inbox.control(sick_open(5, 3));
    n.inbox.control(sick_open(6, 0));
    let t0 = Instant::now();
    n.plane.poll(t0);
    let shorts = |n: &Node| -> Vec<String> {
        n.log
            .lock()
            .unwrap()
            .logs
            .iter()
            .filter(|l| l.contains("shorter than a MAD"))
            .cloned()
            .collect()
    };
    assert_eq!(
        shorts(&n),
        ["ERROR - endpoint 5: datagram shorter than a MAD dropped: 3 (total 3)"]
    );
    // The same QP, nothing new: nothing logged, however long it runs.
    n.plane.poll(t0 + Duration::from_secs(2));
    assert_eq!(shorts(&n).len(), 1);
    // A new QP behind the same endpoint number starts from 0: its first drop is news.
    n.inbox.control(Control::Close(EpId(5)));
    n.inbox.control(sick_open(5, 1));
    n.plane.poll(t0 + Duration::from_secs(4));
    assert_eq!(
        shorts(&n)[1..],
        ["ERROR - endpoint 5: datagram shorter than a MAD dropped: 1 (total 1)"]
    );
}

/// What the partition test's QPs sent to the SM, and what comes back to each.
#[derive(Default)]
struct SmLog {
    /// (endpoint label, MAD) of every SA MAD posted, in order.
    sent: Vec<(u8, [u8; 256])>,
    /// Replies waiting to be received: (endpoint label, source LID, source QP, MAD).
    replies: Vec<(u8, u16, u32, [u8; 256])>,
    /// A rogue host answers every PathRecord GET first (with DLID 0x99): from its own LID 9
    /// and QP 77 to the asking QP, and from the SM's LID and QP 1 to QP `label 1`; the SM's
    /// own reply is held back until both forgeries were received.
    forge: bool,
    /// The SM's replies held back while forgeries are in flight.
    held: Vec<(u8, u16, u32, [u8; 256])>,
    /// Endpoint labels attached to a group.
    attached: Vec<u8>,
    /// The SM's answers to PathRecord GETs are lost.
    gets_lost: bool,
}

/// A UD QP that reaches an SM at LID 1: the SA answers every MCMemberRecord SET (MLID 0xC001)
/// and PathRecord GET (from the port whose GID is the record's SGID, to the node whose LID or
/// GID it names, with the record's P_Key) and acknowledges anything else, back to the sending
/// QP.
struct SmUd {
    label: u8,
    log: Arc<Mutex<SmLog>>,
}

impl Ud for SmUd {
    fn send(&mut self, to: &AcmDest, mad: &[u8; 256]) -> Result<(), SendError> {
        let AcmDest::Unicast(av) = to else {
            return Ok(());
        };
        if av.remote_qpn != 1 {
            return Ok(());
        }
        let mut l = self.log.lock().unwrap();
        l.sent.push((self.label, *mad));
        let mut reply = *mad;
        reply[3] = 0x81;
        match u16::from_be_bytes([mad[16], mad[17]]) {
            0x0038 => reply[92..94].copy_from_slice(&0xc001u16.to_be_bytes()),
            0x0035 => {
                let q = PathRecord::new_unchecked(&mad[56..120]);
                let from = (0..8).find(|&j| node_gid(j) == q.sgid());
                let to = (0..8).find(|&j| node_lid(j) == q.dlid() || node_gid(j) == q.dgid());
                let pkey = if q.pkey() == 0 { 0xffff } else { q.pkey() };
                match (from, to) {
                    (Some(from), Some(to)) => {
                        let mut p = PathRecord::new_unchecked(&mut reply[56..120]);
                        p.set_dgid(node_gid(to));
                        p.set_sgid(node_gid(from));
                        p.set_dlid(node_lid(to));
                        p.set_slid(node_lid(from));
                        p.set_reversible_numpath(true, 0);
                        p.set_pkey(pkey);
                    }
                    _ => reply[4..6].copy_from_slice(&0x0300u16.to_be_bytes()),
                }
            }
            _ => {}
        }
        if l.gets_lost && u16::from_be_bytes([mad[16], mad[17]]) == 0x0035 {
            return Ok(());
        }
        if l.forge && u16::from_be_bytes([mad[16], mad[17]]) == 0x0035 {
            let mut f = reply;
            PathRecord::new_unchecked(&mut f[56..120]).set_dlid(0x99);
            l.replies.push((self.label, 9, 77, f));
            l.replies.push((1, 1, 1, f));
            l.held.push((self.label, 1, 1, reply));
            return Ok(());
        }
        l.replies.push((self.label, 1, 1, reply));
        Ok(())
    }

    fn poll(&mut self, f: &mut dyn FnMut(&RecvMeta, &[u8; 256])) -> usize {
        let mine: Vec<(u8, u16, u32, [u8; 256])> = {
            let mut l = self.log.lock().unwrap();
            let (mine, rest) = l.replies.drain(..).partition(|r| r.0 == self.label);
            l.replies = rest;
            if l.replies.is_empty() {
                let held = std::mem::take(&mut l.held);
                l.replies = held;
            }
            mine
        };
        for (_, slid, src_qp, m) in &mine {
            let meta = RecvMeta {
                slid: *slid,
                src_qp: *src_qp,
                sl: 0,
                dlid_path_bits: 0,
                pkey_index: 0,
                ep_pkey_index: 0,
                grh_sgid: None,
            };
            f(&meta, m);
        }
        mine.len()
    }

    fn attach(&mut self, _group: &McGroup) -> Result<(), String> {
        self.log.lock().unwrap().attached.push(self.label);
        Ok(())
    }

    fn detach(&mut self, _group: &McGroup) {}

    fn arm(&mut self) -> Option<RawFd> {
        None
    }

    fn ack_events(&mut self) {}

    fn sm_addr(&mut self) -> Option<acm_core_nostd::sa_channel::SmAddr> {
        Some(acm_core_nostd::sa_channel::SmAddr { lid: 1, sl: 0 })
    }
}

/// Endpoint `label` of port `port` (the GID and LID of sim node `port`) on `pkey`, its UD QP
/// an [`SmUd`] logging to `sm`; `sa_pkey`: the QP is on the port's SA P_Key.
fn sm_open(sm: &Arc<Mutex<SmLog>>, label: u8, port: usize, pkey: u16, sa_pkey: bool) -> Control {
    Control::Open {
        ep: EpId(label),
        cache_ep: ep_number(0, label),
        cfg: EpConfig {
            port_gid: node_gid(port),
            lid: node_lid(port),
            pkey,
            mtu: 4,
            rate: 7,
            subnet_timeout_ms: 1,
            qpn: 200 + u32::from(label),
            sa_pkey,
        },
        ud: Some(Box::new(SmUd {
            label,
            log: sm.clone(),
        })),
        routes: Vec::new(),
        addrs: Arc::new(Vec::new()),
    }
}

/// A node on the `ud` SA transport (Reports subscribed) with the endpoints `eps` (label,
/// port, P_Key, on the SA P_Key), each an [`SmUd`], run until every one has joined.
fn sm_node(eps: &[(u8, usize, u16, bool)]) -> ([Node; 1], Arc<Mutex<SmLog>>) {
    let n = bare_node(0, ud_sa_config(), false, 1, true);
    let sm = Arc::new(Mutex::new(SmLog::default()));
    for &(label, port, pkey, sa_pkey) in eps {
        n.inbox.control(sm_open(&sm, label, port, pkey, sa_pkey));
    }
    let mut nodes = [n];
    let joined = |_: &[Node]| {
        let a = sm.lock().unwrap().attached.clone();
        eps.iter().all(|e| a.contains(&e.0))
    };
    assert!(run(&mut nodes, joined), "every endpoint joined");
    (nodes, sm)
}

#[test]
fn an_endpoint_of_another_partition_reaches_the_sa_through_its_ports_sa_keyed_qp() {
    // The `ud` SA transport (Reports subscribed).
    // Port A: endpoint 0 on the default partition (the SA P_Key), endpoint 1 on 0x8001.
    // Port B (another GID): endpoint 2 on 0x8002 alone, no SA-keyed QP on its port.
    let (nodes, sm) = sm_node(&[
        (0, 0, 0xffff, true),
        (1, 0, 0x8001, false),
        (2, 1, 0x8002, false),
    ]);
    let l = sm.lock().unwrap();
    // No SA MAD left on a QP of a partition the SM's port is not in.
    assert!(
        l.sent.iter().all(|(label, _)| *label == 0),
        "SA MADs sent by QPs {:?}",
        l.sent.iter().map(|(x, _)| *x).collect::<Vec<_>>()
    );
    // Endpoint 1's join (its partition's MGID) went out on endpoint 0's QP.
    let mgid_pkey = |m: &[u8; 256]| u16::from_be_bytes([m[60], m[61]]);
    let joins: Vec<u16> = l
        .sent
        .iter()
        .filter(|(_, m)| u16::from_be_bytes([m[16], m[17]]) == 0x0038)
        .map(|(_, m)| mgid_pkey(m))
        .collect();
    assert!(
        joins.contains(&0xffff) && joins.contains(&0x8001),
        "{joins:04x?}"
    );
    assert!(
        !joins.contains(&0x8002),
        "port B's join is not port A's business"
    );
    // Report subscriptions (InformInfo SETs for traps 64 and 65): once per port, from the
    // endpoint the SA reaches, not once per endpoint.
    let informs = l
        .sent
        .iter()
        .filter(|(_, m)| u16::from_be_bytes([m[16], m[17]]) == 0x0003 && m[3] == 0x02)
        .count();
    assert_eq!(informs, 2, "one subscription per trap");
    // Port B has no SA-keyed QP: its join went through the core's SA service.
    assert!(nodes[0].log.lock().unwrap().sa_sent >= 1);
}

#[test]
fn a_get_whose_carrier_closes_goes_on_at_once_through_the_cores_service() {
    // Endpoint 1 (0x8001) reaches the SA on endpoint 0's QP. Its Get leaves there, the SM's
    // answer is lost, and endpoint 0 closes: the Get goes on through the core's SA service at
    // once (its tries on a QP that is gone would take seconds, far more than the polls run
    // allows), and is answered once.
    let (mut nodes, sm) = sm_node(&[(0, 0, 0xffff, true), (1, 0, 0x8001, false)]);
    let core_before = nodes[0].log.lock().unwrap().sa_sent;
    sm.lock().unwrap().gets_lost = true;
    let sent = |sm: &Arc<Mutex<SmLog>>| {
        let l = sm.lock().unwrap();
        let gets = l.sent.iter().filter(|(_, m)| m[16..18] == [0, 0x35]);
        gets.count()
    };
    assert!(nodes[0].inbox.request(
        EpId(1),
        7,
        Kind::Resolve,
        &lid_msg(node_lid(1), false, 0x71)
    ));
    assert!(run(&mut nodes, |_| sent(&sm) == 1), "the Get on QP 0");
    assert!(sm.lock().unwrap().sent.iter().all(|(label, _)| *label == 0));
    nodes[0].inbox.control(Control::Close(EpId(0)));
    assert!(run(&mut nodes, |n| !answers(&n[0]).is_empty()), "answered");
    let a = answers(&nodes[0]);
    assert_eq!(
        (a.len(), a[0].ep, a[0].status),
        (1, EpId(1), Status::Success)
    );
    assert_eq!(dlid_of(&a[0]), node_lid(1));
    assert_eq!(nodes[0].log.lock().unwrap().sa_sent, core_before + 1);
    assert_eq!(sent(&sm), 1, "nothing more on a QP");
}

#[test]
fn two_ports_of_one_hca_answer_from_their_own_port_and_reach_the_sa_through_it() {
    // A dual-port HCA: port A (GID and LID of sim node 0) and port B (node 1), each with a
    // default-partition endpoint on the SA P_Key, and port B with a 0x8001 endpoint too. (A
    // real daemon cannot be given a second port here: ibsim attaches each client to its
    // node's first port and umad2sim builds one device with that port; docs/shapes.md.)
    let (mut nodes, sm) = sm_node(&[
        (0, 0, 0xffff, true),
        (1, 1, 0xffff, true),
        (2, 1, 0x8001, false),
    ]);
    // The same destination (LID 6) asked on each endpoint.
    for (ep, client) in [(0u8, 1u64), (1, 2), (2, 3)] {
        assert!(nodes[0].inbox.request(
            EpId(ep),
            client,
            Kind::Resolve,
            &lid_msg(node_lid(5), false, 0x60 + client)
        ));
    }
    assert!(run(&mut nodes, |n| answers(&n[0]).len() == 3));
    for a in answers(&nodes[0]) {
        let p = PathRecord::new_unchecked(&a.msg[24..88]);
        let port = if a.ep == EpId(0) { 0 } else { 1 };
        assert_eq!(a.status, Status::Success, "endpoint {:?}", a.ep);
        assert_eq!(
            (p.slid(), p.sgid(), p.dlid()),
            (node_lid(port), node_gid(port), node_lid(5)),
            "endpoint {:?} answers from its own port",
            a.ep
        );
        let pkey = if a.ep == EpId(2) { 0x8001 } else { 0xffff };
        assert_eq!(p.pkey(), pkey, "endpoint {:?}: its partition", a.ep);
    }
    // Each port's SA MADs left on that port's SA-keyed QP: port A's from QP 0, port B's
    // (both endpoints') from QP 1, never from the 0x8001 QP.
    let l = sm.lock().unwrap();
    for (label, m) in &l.sent {
        let sgid_port = if u16::from_be_bytes([m[16], m[17]]) == 0x0035 {
            (0..2).find(|&j| PathRecord::new_unchecked(&m[56..120]).sgid() == node_gid(j))
        } else {
            None
        };
        assert_ne!(*label, 2, "an SA MAD on the 0x8001 QP");
        if let Some(port) = sgid_port {
            assert_eq!(
                usize::from(*label),
                port,
                "a PathRecord query left on the other port"
            );
        }
    }
}

#[test]
fn forged_sa_replies_from_another_host_or_on_another_qp_are_dropped_and_logged() {
    // A rogue host knows the TID of our PathRecord query (it cannot guess it: sa.rs's test)
    // and answers first with a bad path: from its own LID and QP to the asking QP, and with
    // the SM's LID and QP 1 but to a QP that did not ask. Only the SM's reply on the asking
    // QP is taken.
    let (mut nodes, sm) = sm_node(&[(0, 0, 0xffff, true), (1, 0, 0x8001, false)]);
    sm.lock().unwrap().forge = true;
    assert!(nodes[0].inbox.request(
        EpId(0),
        1,
        Kind::Resolve,
        &lid_msg(node_lid(5), false, 0x61)
    ));
    assert!(
        run(&mut nodes, |n| !answers(&n[0]).is_empty()),
        "{:?}",
        nodes[0].log.lock().unwrap().logs
    );
    let a = answers(&nodes[0]);
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].status, Status::Success);
    assert_eq!(
        PathRecord::new_unchecked(&a[0].msg[24..88]).dlid(),
        node_lid(5),
        "the SM's path, not the forger's"
    );
    // Counted and logged (at most once a second: run rounds until the line is out).
    let logged = |n: &[Node]| {
        n[0].log
            .lock()
            .unwrap()
            .logs
            .iter()
            .any(|l| l.contains("SA MAD not from the SM") && l.contains("(total 2)"))
    };
    let t0 = Instant::now();
    while !logged(&nodes) && t0.elapsed() < Duration::from_secs(5) {
        run(&mut nodes, |_| false);
    }
    assert!(logged(&nodes), "{:?}", nodes[0].log.lock().unwrap().logs);
}

/// A node whose plane runs on a real worker thread (as in the provider).
fn on_worker(n: Node) -> (Worker, Arc<Inbox>, Arc<Mutex<CoreLog>>) {
    on_worker_with(n, acm_dataplane::worker::WorkerConfig::default())
}

/// [`on_worker`] with the worker configured by `cfg`.
fn on_worker_with(
    n: Node,
    cfg: acm_dataplane::worker::WorkerConfig,
) -> (Worker, Arc<Inbox>, Arc<Mutex<CoreLog>>) {
    let Node { plane, inbox, log } = n;
    let worker = Worker::spawn(cfg, inbox.waker.clone(), plane).unwrap();
    (worker, inbox, log)
}

/// Waits until the node's endpoint has joined its group (logged by the plane).
fn wait_joined(log: &Mutex<CoreLog>) {
    wait("the endpoint's join", || {
        log.lock()
            .unwrap()
            .logs
            .iter()
            .any(|l| l.contains("joined"))
    });
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_recovery_that_panics_gives_up_and_every_request_is_still_answered_once() {
    let wire: Wire = Arc::default();
    let (worker, inbox, log) = on_worker(node(0, &wire, false));
    wait_joined(&log);
    // The SA send of a miss panics inside the loop, and so does the log line that opens the
    // recovery: the worker makes the plane give up (its own log line panics as well).
    {
        let mut l = log.lock().unwrap();
        l.panic_sa = true;
        l.panic_logs = 2;
    }
    assert!(inbox.request(EpId(0), 1, Kind::Resolve, &lid_msg(9, false, 0x71)));
    wait("request 1 answered", || {
        log.lock().unwrap().answers.iter().any(|a| a.client == 1)
    });
    assert!(inbox.is_stopped(), "the loop has stopped");
    assert!(!inbox.waker.exited(), "its thread still runs");
    // Now the inbox refuses requests (the provider answers them at once, ENODATA).
    assert!(!inbox.request(EpId(0), 2, Kind::Resolve, &lid_msg(9, false, 0x72)));
    let (restarts, gave_up, exited) = inbox.health();
    assert_eq!((restarts, gave_up, exited), (0, 1, false));
    // Exactly one answer for request 1, an error.
    std::thread::sleep(Duration::from_millis(50));
    let a: Vec<Got> = log.lock().unwrap().answers.clone();
    let ones: Vec<&Got> = a.iter().filter(|a| a.client == 1).collect();
    assert_eq!(ones.len(), 1, "{a:?}");
    assert_ne!(ones[0].status, Status::Success);
    inbox.control(Control::Shutdown);
    worker.join().unwrap();
    assert!(inbox.waker.exited());
}

/// The loop runs its rounds on the producers' threads when it is free and on its own thread
/// otherwise, never two at once. Four threads hand over misses (names over the in-memory
/// network, LIDs through the SA) while the worker runs, and the endpoint goes down half-way
/// (its QP closed under the senders): no two calls into the QP overlap, and every request is
/// answered exactly once.
#[test]
fn rounds_on_producer_threads_never_overlap_and_every_request_is_answered_once() {
    use std::sync::atomic::Ordering::SeqCst;
    let wire: Wire = Arc::default();
    let watch = Arc::new(Overlap::default());
    let (w1, inbox1, log1) = on_worker(node(1, &wire, false));
    // The `event` mode's worker (no spin): it parks after each round, so the producers find
    // the loop free as often as the worker takes it, and both run rounds.
    let event = acm_dataplane::worker::WorkerConfig {
        spin: Duration::ZERO,
        spin_for_reply: Duration::ZERO,
        ..Default::default()
    };
    let node0 = node_watched(0, &wire, false, usize::MAX, watch.clone());
    let (w0, inbox, log) = on_worker_with(node0, event);
    wait_joined(&log);
    wait_joined(&log1);
    const THREADS: u64 = 4;
    const EACH: u64 = 150;
    let total = (THREADS * EACH) as usize;
    let go = Arc::new(std::sync::Barrier::new(THREADS as usize + 1));
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (inbox, go) = (inbox.clone(), go.clone());
            std::thread::spawn(move || {
                go.wait();
                for i in 0..EACH {
                    let client = t * 1000 + i;
                    let msg = match i % 3 {
                        0 => name_msg("node1", Some("node0"), false, client),
                        _ => lid_msg(node_lid(1), false, client),
                    };
                    // Refused only while the queue is full: hand it over again.
                    while !inbox.request(EpId(0), client, Kind::Resolve, &msg) {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    go.wait();
    wait("half the requests answered", || {
        log.lock().unwrap().answers.len() >= total / 2
    });
    inbox.control(Control::Close(EpId(0)));
    for p in producers {
        p.join().unwrap();
    }
    wait("every request answered", || {
        log.lock().unwrap().answers.len() >= total
    });
    std::thread::sleep(Duration::from_millis(20));
    let answers = log.lock().unwrap().answers.clone();
    assert_eq!(answers.len(), total, "one answer each, none twice");
    let mut clients: Vec<u64> = answers.iter().map(|a| a.client).collect();
    clients.sort_unstable();
    clients.dedup();
    assert_eq!(clients.len(), total);
    assert!(
        answers.iter().any(|a| a.status == Status::Success),
        "resolved before the close"
    );
    assert_eq!(watch.overlaps.load(SeqCst), 0, "two rounds ran at once");
    assert!(watch.calls.load(SeqCst) > 0);
    // Usually the worker and several producers all ran rounds (the worker unit tests prove
    // that a producer runs one when the loop is free); on a loaded machine the worker may
    // have taken every one, which proves less but is no failure.
    let threads = watch.threads.lock().unwrap().len();
    eprintln!("the QP was called from {threads} thread(s)");
    assert_eq!(inbox.health(), (0, 0, false), "no panic, nothing given up");
    for (inbox, worker) in [(inbox, w0), (inbox1, w1)] {
        inbox.control(Control::Shutdown);
        worker.join().unwrap();
    }
}

/// A plane whose worker thread stops inside a round while its gate is shut (a loop stuck in
/// a system call or a driver, holding the loop), and runs on when it opens. Rounds on other
/// threads (a producer's, the watchdog's) are not stopped: a stuck thread is the worker.
struct Gated {
    plane: Plane<FakeCore>,
    shut: Arc<(Mutex<bool>, std::sync::Condvar)>,
}

impl acm_dataplane::worker::Poller for Gated {
    fn poll(&mut self, now: Instant) -> acm_dataplane::worker::PollOutcome {
        let (m, cv) = &*self.shut;
        let mut shut = m.lock().unwrap();
        let worker = std::thread::current().name() == Some("acmrs-worker");
        while *shut && worker {
            shut = cv.wait(shut).unwrap();
        }
        drop(shut);
        self.plane.poll(now)
    }
    fn finished(&self) -> bool {
        self.plane.finished()
    }
}

#[test]
fn requests_waiting_on_a_stuck_loop_are_answered_by_the_watchdog_exactly_once() {
    use acm_dataplane::watchdog::Watchdog;
    let wire: Wire = Arc::default();
    let Node { plane, inbox, log } = node(0, &wire, false);
    let shut = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    let worker = Worker::spawn(
        acm_dataplane::worker::WorkerConfig::default(),
        inbox.waker.clone(),
        Gated {
            plane,
            shut: shut.clone(),
        },
    )
    .unwrap();
    wait_joined(&log);
    let by_dog: Arc<Mutex<Vec<(u64, Status)>>> = Arc::default();
    let logs: Arc<Mutex<Vec<String>>> = Arc::default();
    let (answered, said) = (by_dog.clone(), logs.clone());
    let dog = Watchdog::spawn(
        inbox.clone(),
        Duration::from_millis(200),
        move |r, s| answered.lock().unwrap().push((r.head.client, s)),
        move |_, t| said.lock().unwrap().push(t.to_string()),
    )
    .unwrap();
    // The loop gets stuck: it runs no more rounds (its current one ends first).
    *shut.0.lock().unwrap() = true;
    let rounds = inbox.rounds();
    std::thread::sleep(Duration::from_millis(150));
    wait("the loop to stop", || {
        let r = inbox.rounds();
        std::thread::sleep(Duration::from_millis(120));
        r == inbox.rounds()
    });
    assert!(inbox.rounds() >= rounds);
    for c in 1..=5u64 {
        assert!(inbox.request(EpId(0), c, Kind::Resolve, &lid_msg(9, false, c)));
    }
    wait("the watchdog's answers", || {
        by_dog.lock().unwrap().len() == 5
    });
    assert!(inbox.is_stalled());
    // New requests are refused while it is stuck (the provider answers them ETIMEDOUT).
    assert!(!inbox.request(EpId(0), 6, Kind::Resolve, &lid_msg(9, false, 6)));
    let mut got = by_dog.lock().unwrap().clone();
    got.sort();
    let want: Vec<(u64, Status)> = (1..=5).map(|c| (c, Status::Etimedout)).collect();
    assert_eq!(got, want);
    assert!(logs.lock().unwrap()[0].contains("has not run for 200 ms"));
    // The loop runs again: the inbox opens, the loop answers new requests itself, and none of
    // the five is ever answered twice.
    *shut.0.lock().unwrap() = false;
    shut.1.notify_all();
    wait("the inbox to open", || !inbox.is_stalled());
    assert!(logs
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("runs again")));
    assert!(inbox.request(EpId(0), 7, Kind::Resolve, &lid_msg(9, false, 7)));
    wait("request 7 answered by the loop", || {
        log.lock().unwrap().answers.iter().any(|a| a.client == 7)
    });
    assert!(log.lock().unwrap().answers.iter().all(|a| a.client > 5));
    assert_eq!(by_dog.lock().unwrap().len(), 5);
    dog.stop();
    inbox.control(Control::Shutdown);
    worker.join().unwrap();
}

#[test]
fn a_worker_whose_poller_cannot_even_give_up_exits_and_says_so() {
    struct Hopeless;
    impl acm_dataplane::worker::Poller for Hopeless {
        fn poll(&mut self, _: Instant) -> acm_dataplane::worker::PollOutcome {
            panic!("poll")
        }
        fn finished(&self) -> bool {
            false
        }
        fn recover(&mut self, _: &str) {
            panic!("recover")
        }
        fn give_up(&mut self) {
            panic!("give up")
        }
    }
    let waker = Worker::new_waker();
    let worker = Worker::spawn(Default::default(), waker.clone(), Hopeless).unwrap();
    wait("the worker's exit", || waker.exited());
    // Nothing the cache holds is fresh any more: the clock reads the end of time.
    assert_eq!(waker.coarse_ms(), u64::MAX);
    worker.join().unwrap();
}
