//! Invariants of the storm model and its driving (small N; virtual time only, nothing timed).

use acm_core_nostd::node::Transport;
use acm_core_nostd::sim::SaService;
use acmrs_storm::{run, Dest, Params, Peers, Profile, Report};

fn small(nodes: usize, peers: usize, profile: Profile) -> Params {
    let mut p = Params::new(nodes, peers, profile);
    p.checks = true;
    p.concurrency = 16;
    p
}

fn clean(r: &Report) {
    assert!(
        r.violations.is_empty(),
        "{:?}",
        &r.violations[..r.violations.len().min(5)]
    );
    assert_eq!(r.unanswered, 0, "every request answered");
    assert_eq!(r.wrong, 0, "every path leads to its peer");
    let pairs = r.params.nodes * r.params.peers;
    assert_eq!(r.pair_done.len(), pairs, "every pair resolved exactly once");
    assert_eq!(r.node_done.len(), r.params.nodes);
    assert!(r.all_done.is_some());
    // Every request issued got exactly one answer: the successes plus the failures.
    assert_eq!(r.issued, pairs as u64 + r.failed);
}

/// The SA served no more than `rate × window` in any window of whole milliseconds (+1 for the
/// query in service at the window's start).
fn never_faster_than_rate(r: &Report) {
    let per_ms = &r.sa.served_per_ms;
    let rate = 1e6 / r.params.sa.get_ns as f64;
    for w in [1usize, 3, 10, 100] {
        let mut sum: u64 = per_ms.iter().take(w).map(|&x| u64::from(x)).sum();
        for i in w..=per_ms.len() {
            assert!(
                sum as f64 <= rate * w as f64 + 1.0,
                "{sum} served in {w} ms ending at {i}"
            );
            if i < per_ms.len() {
                sum += u64::from(per_ms[i]);
                sum -= u64::from(per_ms[i - w]);
            }
        }
    }
    let total: u64 = per_ms.iter().map(|&x| u64::from(x)).sum();
    assert_eq!(total, r.sa.served);
}

#[test]
fn acmrs_one_query_per_pair_when_nothing_is_lost() {
    for (pick, dest) in [(Peers::Ring, Dest::Lid), (Peers::Random, Dest::Gid)] {
        let mut p = small(40, 12, Profile::Acmrs);
        p.pick = pick;
        p.dest = dest;
        let r = run(p);
        clean(&r);
        let pairs = (p.nodes * p.peers) as u64;
        assert_eq!(r.sa_queries, pairs, "{pick:?} {dest:?}");
        assert_eq!(r.sa.served, pairs);
        assert_eq!(r.per_dest_max, 1);
        assert_eq!(r.per_dest_repeats, 0);
        assert_eq!((r.sa.busy, r.sa.umad_timeouts, r.failed), (0, 0, 0));
        never_faster_than_rate(&r);
    }
}

#[test]
fn the_sa_never_serves_faster_than_its_rate() {
    for profile in [Profile::Acmrs, Profile::IbacmpLike] {
        let mut p = small(60, 20, profile);
        p.sa.get_ns = SaService::get_ns_for_rate(2_000);
        let r = run(p);
        clean(&r);
        never_faster_than_rate(&r);
        // 1 200 queries at 2 000/s cannot finish before 0.6 s.
        assert!(r.all_done.unwrap_or(0) >= 600, "{:?}", r.all_done);
    }
}

#[test]
fn busy_sa_option_answers_busy_when_the_queue_is_full_and_never_holds_more() {
    for profile in [Profile::Acmrs, Profile::IbacmpLike] {
        let mut p = small(50, 10, profile);
        p.sa = SaService {
            get_ns: SaService::get_ns_for_rate(1_000),
            busy_queue: Some(20),
            fifo_timeout: 0,
            ..SaService::DEFAULT
        };
        p.client_retry = 200;
        let r = run(p);
        clean(&r);
        assert!(
            r.sa.busy > 0,
            "{profile:?}: BUSY with 50 senders and room for 20"
        );
        assert!(r.sa.peak_queue <= 20, "{}", r.sa.peak_queue);
        assert_eq!(r.sa.peak_queue, 20, "the queue fills");
        // Every SA query the resolvers sent was either served or answered BUSY (no loss, no
        // timeouts here).
        assert_eq!(r.sa.umad_timeouts, 0);
        assert_eq!(r.sa.served + r.sa.busy, r.sa.sent);
        assert_eq!(r.sa.dropped, 0);
        never_faster_than_rate(&r);
    }
}

/// OpenSM (the default): however overloaded, never a BUSY; past `max_msg_fifo_timeout` new
/// Gets are dropped without an answer, the MAD layer retransmits them, and every pair still
/// completes. Every MAD that reached the SA was served or dropped.
#[test]
fn opensm_never_answers_busy_it_drops_silently_past_the_fifo_timeout() {
    for profile in [Profile::Acmrs, Profile::IbacmpLike] {
        let mut p = small(50, 10, profile);
        // 1 000 Gets/s: acmrs keeps 50 × 16 queued (800 ms), ibacmp-like 50 (50 ms); both
        // beyond 20 ms.
        p.sa = SaService {
            get_ns: SaService::get_ns_for_rate(1_000),
            fifo_timeout: 20,
            umad_timeout: 200,
            ..SaService::DEFAULT
        };
        p.client_retry = 200;
        let r = run(p);
        clean(&r);
        assert_eq!(r.sa.busy, 0, "{profile:?}: OpenSM never answers BUSY");
        assert!(r.sa.dropped > 0, "{profile:?}: {:?}", r.sa);
        assert!(r.sa.retransmits > 0, "a dropped Get is retransmitted");
        assert_eq!(r.sa.lost, 0);
        assert_eq!(r.sa.served + r.sa.dropped, r.sa.sent, "served or dropped");
        never_faster_than_rate(&r);
    }
}

/// The drop threshold is the queue wait: with waits below `max_msg_fifo_timeout` nothing is
/// dropped, with the same load and a timeout below the waits Gets are.
#[test]
fn drops_start_only_when_the_queue_wait_passes_the_fifo_timeout() {
    // ibacmp-like, 30 nodes, 1 000 Gets/s: at most 30 queued, so every wait is below 30 ms.
    let mut p = small(30, 10, Profile::IbacmpLike);
    p.sa = SaService {
        get_ns: SaService::get_ns_for_rate(1_000),
        fifo_timeout: 40,
        ..SaService::DEFAULT
    };
    let r = run(p);
    clean(&r);
    assert!(r.sa.peak_wait_us < 40_000, "{}", r.sa.peak_wait_us);
    assert!(r.sa.peak_wait_us >= 20_000, "{}", r.sa.peak_wait_us);
    assert_eq!((r.sa.dropped, r.sa.busy, r.failed), (0, 0, 0));
    p.sa.fifo_timeout = 10;
    p.sa.umad_timeout = 100;
    let r = run(p);
    clean(&r);
    assert!(r.sa.dropped > 0);
    assert_eq!(r.sa.busy, 0);
}

/// `SaService::DEFAULT` is OpenSM as measured: the `[model]` figures `opensm-sa` wrote, the
/// code's default `max_msg_fifo_timeout`, and no BUSY.
#[test]
fn the_default_sa_is_opensm_as_measured() {
    let toml = include_str!("../opensm-measured.toml");
    let section = |name: &str| -> &str {
        let s = toml
            .split(name)
            .nth(1)
            .unwrap_or_else(|| panic!("a {name} section"));
        s.split("\n[").next().unwrap_or(s)
    };
    let (model, sm_port) = (section("[model]"), section("[sm_port]"));
    let value = |sec: &str, k: &str| -> u64 {
        sec.lines()
            .find_map(|l| {
                l.strip_prefix(k)?
                    .trim()
                    .strip_prefix('=')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{k} in its section"))
    };
    let d = SaService::DEFAULT;
    assert_eq!(d.get_ns, value(model, "get_service_us") * 1000);
    assert_eq!(d.table_record_ns, value(model, "table_record_ns"));
    assert_eq!(d.fifo_timeout, value(model, "max_msg_fifo_timeout_ms"));
    assert!(model.contains("busy = false"));
    // The SM's port: a segment's share of a Get in its own run, of the model's Get.
    assert_eq!(
        d.sm_mad_ns,
        value(sm_port, "segment_per_get_permille") * d.get_ns / 1000
    );
    assert_eq!(d.busy_queue, None, "OpenSM never answers BUSY");
    assert_eq!(Params::new(10, 5, Profile::Acmrs).sa, d);
}

#[test]
fn ibacmp_like_has_at_most_one_query_in_flight_per_node() {
    let mut p = small(30, 20, Profile::IbacmpLike);
    p.concurrency = 20;
    let r = run(p);
    clean(&r);
    assert_eq!(r.sa.peak_node_inflight, 1);
    let mut q = p;
    q.profile = Profile::Acmrs;
    let r = run(q);
    clean(&r);
    // acmrs starts with one query out (slow start) and grows by one per answer towards its
    // window (acmrs_sa_window, 16) while the SA's round trip stays low; its SA channel also
    // holds its join and its two subscriptions.
    assert!(
        (2..=16 + 3).contains(&r.sa.peak_node_inflight),
        "acmrs's window grows from 1 towards 16: {}",
        r.sa.peak_node_inflight
    );
}

#[test]
fn core_sa_depth_holds_sends_back() {
    // acmrs over the core's service (`acmrs_sa_transport core`), whose credits apply.
    let mut p = small(20, 10, Profile::Acmrs);
    p.transport = Transport::Core;
    p.sa.core_sa_depth = Some(1);
    let r = run(p);
    clean(&r);
    assert_eq!(r.sa.peak_node_inflight, 1, "the core's one credit");
    // acmrs's window (grown from one by slow start while the core's one credit serialises
    // its queries) waits in the core beyond that credit.
    assert!(
        r.sa.peak_core_wait >= 2,
        "the rest of acmrs's window waits in the core: {}",
        r.sa.peak_core_wait
    );
}

#[test]
fn losses_and_a_slow_sa_give_retransmits_timeouts_late_replies_and_still_complete() {
    for profile in [Profile::Acmrs, Profile::IbacmpLike] {
        // 30 senders over a lossy fabric: ibacmp-like keeps 30 queries queued (30 ms at
        // 1 000/s, below one 50 ms try); acmrs's window grows from one while the round trip
        // stays low (at 4 000/s).
        let mut p = small(30, 10, profile);
        p.sa = SaService {
            get_ns: SaService::get_ns_for_rate(if profile == Profile::Acmrs {
                4_000
            } else {
                1_000
            }),
            loss: 50,
            umad_timeout: 50,
            umad_retries: 1,
            ..SaService::DEFAULT
        };
        p.client_retry = 50;
        let r = run(p);
        clean(&r);
        assert!(r.sa.lost > 0 && r.sa.retransmits > 0, "{:?}", r.sa);
        assert!(r.sa.umad_timeouts > 0, "{profile:?}: {:?}", r.sa);
        if profile == Profile::Acmrs {
            // A query none of whose tries was answered goes again after a backoff: no
            // client sees a failure.
            assert_eq!(r.failed, 0, "{:?}", r.sa);
        } else {
            assert!(
                r.failed > 0,
                "ibacmp-like fails what its MAD layer gives up"
            );
        }
        never_faster_than_rate(&r);
    }
}

#[test]
fn deterministic() {
    let mut p = small(30, 10, Profile::Acmrs);
    p.sa.loss = 20;
    p.sa.umad_timeout = 100;
    p.pick = Peers::Random;
    let (a, b) = (run(p), run(p));
    assert_eq!(a.pair_done, b.pair_done);
    assert_eq!(a.sa, b.sa);
}

#[test]
fn an_all_to_all_start_costs_the_sa_a_table_a_probe_and_a_few_gets_per_node_by_lid_and_by_gid() {
    // 150 nodes, each to all 149 others, 64 requests in flight: each port's backlog makes its
    // half-world table worth it; the SA serves per node a table, the probe before it (no LID
    // past the table room) and the Gets the window let out until the table went (the first,
    // and one more per answer while the probe was out), not 149 Gets, and the start ends
    // sooner than ibacmp-like's one Get at a time.
    for dest in [Dest::Lid, Dest::Gid] {
        let mut p = small(150, 149, Profile::Acmrs);
        p.concurrency = 64;
        p.dest = dest;
        let r = run(p);
        clean(&r);
        assert_eq!(r.tables, (150, 0), "{dest:?}");
        assert_eq!(r.sa.tables, 150);
        assert!(
            r.sa_queries <= 5 * 150,
            "{dest:?}: {} queries",
            r.sa_queries
        );
        assert_eq!((r.sa.dropped, r.sa.umad_timeouts, r.failed), (0, 0, 0));
        let mut q = small(150, 149, Profile::IbacmpLike);
        q.concurrency = 64;
        q.dest = dest;
        let s = run(q);
        clean(&s);
        assert_eq!((s.tables, s.sa_queries), ((0, 0), 150 * 149));
        assert!(
            r.all_done < s.all_done,
            "{:?} vs {:?}",
            r.all_done,
            s.all_done
        );
    }
    // A cache too small for the table (room for 74 records): the probe finds LID 75, no table
    // is asked (the SA computes none), the Gets resolve everything; nothing fails.
    let mut p = small(150, 149, Profile::Acmrs);
    p.concurrency = 64;
    p.cache = Some(149);
    let r = run(p);
    clean(&r);
    assert_eq!((r.tables, r.sa.tables), ((0, 0), 0));
    assert_eq!(r.failed, 0);
}
