//! `verbs::UdEndpoint` on a simulated fabric (ibsim + OpenSM + simverbs): `ud-agent` processes
//! (`tools/ud-agent/src/main.rs`) on net.2sw2path4hca's HCAs, each a real libibverbs program whose
//! verbs are simverbs'. Needs `cargo build -p simverbs` into the same target dir first.

mod common;
use common::{field, Fabric};
use std::time::{Duration, Instant};

/// An ACM-style base-group MGID (ff15:4001:ffff:0304::, pkey 0xffff, rate 3, mtu 4) and the
/// MLID OpenSM would give it; simverbs takes any MLID in 0xC000..=0xFFFE.
const MGID: &str = "ff154001ffff00030400000000000000";
const MLID: u16 = 0xc001;

#[test]
fn unicast_exchange_reports_sender_in_recv_meta() {
    let f = Fabric::start("uni");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    let ea = a.open(64, 8);
    let eb = b.open(64, 8);
    assert_ne!(ea.lid, eb.lid);
    assert_ne!(ea.gid, eb.gid);
    assert_eq!(
        (ea.pkey_index, eb.pkey_index),
        (0, 0),
        "default partition at index 0"
    );

    // A → B: B's RecvMeta names A (LID, QPN, GRH source GID), all 256 bytes arrive. B is
    // already blocked in poll(2) on its completion channel when the MAD comes (the event path).
    b.start("recv 1 5000");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        a.cmd(&format!("send {} {} {} 100", eb.lid, eb.qpn, eb.gid)),
        "ok sent=1"
    );
    let got = b.recv_reply();
    assert_eq!(got.len(), 1, "B received nothing");
    let m = &got[0];
    assert_eq!(m["tag"], "100");
    assert_eq!(m["intact"], "1", "MAD bytes changed: {m:?}");
    assert_eq!(m["slid"], ea.lid.to_string());
    assert_eq!(m["src_qp"], ea.qpn.to_string());
    assert_eq!(m["sgid"], ea.gid, "GRH source GID");
    assert_eq!(m["sl"], "0");
    assert_eq!(m["path_bits"], "0");
    assert_eq!(m["pkey_index"], "0");
    assert_eq!(m["ep_pkey_index"], "0");

    // B answers with what it learned (as the resolver does: dlid = slid, QPN = src_qp,
    // DGID = GRH SGID); A sees B.
    assert_eq!(
        b.cmd(&format!(
            "send {} {} {} 200",
            m["slid"], m["src_qp"], m["sgid"]
        )),
        "ok sent=1"
    );
    let back = a.recv(1, 3000);
    assert_eq!(back.len(), 1, "A received nothing");
    assert_eq!(back[0]["tag"], "200");
    assert_eq!(back[0]["slid"], eb.lid.to_string());
    assert_eq!(back[0]["src_qp"], eb.qpn.to_string());
    assert_eq!(back[0]["sgid"], eb.gid);

    // The same AV again: the cached AH is reused; a wrong QPN reaches nobody.
    assert_eq!(
        a.cmd(&format!("send {} {} {} 101 3", eb.lid, eb.qpn, eb.gid)),
        "ok sent=3"
    );
    let tags: Vec<String> = b.recv(3, 3000).iter().map(|m| m["tag"].clone()).collect();
    assert_eq!(tags, ["101", "102", "103"]);
    assert_eq!(
        a.cmd(&format!("send {} {} {} 300", eb.lid, eb.qpn + 7, eb.gid)),
        "ok sent=1"
    );
    assert!(b.recv(1, 300).is_empty());
    let sa = a.stats();
    assert_eq!(sa["ah_created"], 1, "one AV, one AH: {sa:?}");
    assert_eq!(sa["sends"], 5);
    assert_eq!(sa["send_errors"], 0);
    let sb = b.stats();
    assert_eq!(sb["recvs"], 4);
    assert_eq!(sb["recv_errors"], 0);
    assert_eq!(sb["recv_posted"], 64, "every buffer re-posted: {sb:?}");
    assert!(
        sb["events"] > 0,
        "B never woke through the completion channel: {sb:?}"
    );
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

/// A query posted while the endpoint waits on its completion channel does not wake it: sends
/// complete on a CQ of their own, without a channel. Only what arrives does (the answer a
/// parked dataplane waits for); the send's completion is still drained by the next poll.
#[test]
fn a_send_does_not_wake_the_channel_only_a_receive_does() {
    let f = Fabric::start("sendwake");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    let _ea = a.open(64, 8);
    let eb = b.open(64, 8);
    assert_eq!(a.cmd("poll"), "ok completions=0");
    assert_eq!(a.cmd("arm"), "ok");
    assert_eq!(
        a.cmd(&format!("send {} {} {} 7", eb.lid, eb.qpn, eb.gid)),
        "ok sent=1"
    );
    assert_eq!(a.cmd("wait 300"), "ok woke=0", "the send woke the channel");
    assert_eq!(a.cmd("poll"), "ok completions=1", "the send's completion");
    let got = b.recv(1, 3000);
    assert_eq!(got.len(), 1, "B received nothing");
    assert_eq!(got[0]["tag"], "7");
    // B → A while A waits, armed: that wakes it.
    assert_eq!(a.cmd("arm"), "ok");
    assert_eq!(
        b.cmd(&format!(
            "send {} {} {} 8",
            got[0]["slid"], got[0]["src_qp"], got[0]["sgid"]
        )),
        "ok sent=1"
    );
    assert_eq!(
        a.cmd("wait 3000"),
        "ok woke=1",
        "the receive did not wake the channel"
    );
    let back = a.recv(1, 3000);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0]["tag"], "8");
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

#[test]
fn multicast_reaches_attached_members_only() {
    let f = Fabric::start("mc");
    let mut s = f.agent("Hca2");
    let mut m1 = f.agent("Hca3");
    let mut m2 = f.agent("Hca4");
    let es = s.open(32, 4);
    let e1 = m1.open(32, 4);
    let e2 = m2.open(32, 4);
    for n in [&mut s, &mut m1, &mut m2] {
        assert_eq!(n.cmd(&format!("attach 0 {MGID} {MLID}")), "ok");
    }
    // Idempotent re-attach; a non-multicast LID is refused by ibv_attach_mcast.
    assert_eq!(m1.cmd(&format!("attach 0 {MGID} {MLID}")), "ok");
    let bad = m1.cmd(&format!("attach 1 {MGID} 5"));
    assert!(bad.starts_with("err ibv_attach_mcast"), "{bad}");
    assert_eq!(f.mcast_members(MGID).len(), 3);

    assert_eq!(s.cmd("msend 0 500 2"), "ok sent=2");
    for (n, e) in [(&mut m1, &e1), (&mut m2, &e2)] {
        let got = n.recv(2, 3000);
        assert_eq!(got.len(), 2, "member on {} got {got:?}", n.host);
        for (i, m) in got.iter().enumerate() {
            assert_eq!(m["tag"], (500 + i).to_string());
            assert_eq!(m["intact"], "1");
            assert_eq!(m["slid"], es.lid.to_string());
            assert_eq!(m["src_qp"], es.qpn.to_string());
            assert_eq!(m["sgid"], es.gid, "GRH source GID on {}", n.host);
        }
        let _ = e;
    }
    // The sender is attached too but does not hear itself (simverbs' loopback rule).
    assert!(s.recv(1, 300).is_empty());

    // Detached: m2 gets nothing more, m1 still does; the membership file is gone.
    assert_eq!(m2.cmd(&format!("detach 0 {MGID} {MLID}")), "ok");
    assert_eq!(f.mcast_members(MGID).len(), 2);
    assert!(!f
        .mcast_members(MGID)
        .contains(&format!("{}.{}", e2.lid, e2.qpn)));
    assert_eq!(s.cmd("msend 0 600"), "ok sent=1");
    assert_eq!(m1.recv(1, 3000)[0]["tag"], "600");
    assert!(m2.recv(1, 500).is_empty(), "a detached member received");

    // Group index not attached (m2 detached its only group; 7 never existed): a clear error.
    assert!(m2
        .cmd("msend 0 700")
        .starts_with("err sent=0 unknown-group"));
    assert!(s.cmd("msend 7 700").starts_with("err sent=0 unknown-group"));
    assert_eq!(s.stats()["ah_created"], 1);

    // Detach while a send through the group's AH is still in flight (not reaped): the AH
    // lives until its completion, then goes; close then finds nothing left (dealloc_pd would
    // say EBUSY for a leaked AH).
    assert_eq!(m1.cmd("msend 0 800"), "ok sent=1");
    assert_eq!(m1.cmd(&format!("detach 0 {MGID} {MLID}")), "ok");
    assert!(m1
        .cmd("msend 0 801")
        .starts_with("err sent=0 unknown-group"));
    assert_eq!(s.recv(1, 3000)[0]["tag"], "800");
    assert_eq!(m1.cmd("poll"), "ok completions=1");
    let r = m1.cmd("close");
    assert!(r.starts_with("ok "), "{r}");
    for n in [s, m1, m2] {
        assert_eq!(n.quit(Duration::from_secs(5)), Some(0));
    }
    assert!(f.mcast_members(MGID).is_empty(), "membership left behind");
}

#[test]
fn send_buffer_exhaustion_is_an_error_not_a_hang() {
    let f = Fabric::start("nobuf");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    // P_Key lookup: a partition not in the table is refused; the limited-member form of the
    // default partition finds its (full-member) entry at index 0.
    assert!(
        a.cmd("open 16 4 0x1234").starts_with("err pkey 0x1234"),
        "unknown P_Key accepted"
    );
    let r = a.cmd("open 8 2 0x7fff");
    assert_eq!(field(&r, "pkey_index"), "0", "{r}");
    assert!(a.cmd("close").starts_with("ok "));
    a.open(16, 4);
    let eb = b.open(64, 4);
    // No poll in between: four sends take the four buffers, the fifth is refused at once.
    let t = Instant::now();
    let r = a.cmd(&format!("send {} {} {} 1 10", eb.lid, eb.qpn, eb.gid));
    assert!(t.elapsed() < Duration::from_secs(5), "send blocked");
    assert!(r.starts_with("err sent=4 nobuf"), "{r}");
    let st = a.stats();
    assert_eq!(st["no_buffer"], 1);
    assert_eq!(st["send_inflight"], 4);
    assert_eq!(st["sends"], 4);
    // Again without polling: still refused, counted again.
    assert!(a
        .cmd(&format!("send {} {} {} 50", eb.lid, eb.qpn, eb.gid))
        .starts_with("err sent=0 nobuf"));
    assert_eq!(a.stats()["no_buffer"], 2);
    // Reaping the completions frees the buffers.
    assert_eq!(a.cmd("poll"), "ok completions=4");
    assert_eq!(a.stats()["send_inflight"], 0);
    assert_eq!(
        a.cmd(&format!("send {} {} {} 5 4", eb.lid, eb.qpn, eb.gid)),
        "ok sent=4"
    );
    let tags: Vec<String> = b.recv(8, 3000).iter().map(|m| m["tag"].clone()).collect();
    assert_eq!(tags, ["1", "2", "3", "4", "5", "6", "7", "8"]);
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

#[test]
fn receive_buffers_are_reposted() {
    let f = Fabric::start("repost");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    a.open(16, 8);
    let eb = b.open(8, 2);
    // 6 rounds of a full receive queue (8) = 48 MADs through 8 buffers, none lost.
    let mut seen = Vec::new();
    for round in 0..6u64 {
        let tag = 1000 + round * 8;
        assert_eq!(
            a.cmd(&format!("send {} {} {} {tag} 8", eb.lid, eb.qpn, eb.gid)),
            "ok sent=8"
        );
        assert_eq!(a.cmd("poll"), "ok completions=8");
        let got = b.recv(8, 3000);
        assert_eq!(got.len(), 8, "round {round}: {got:?}");
        for m in &got {
            assert_eq!(m["intact"], "1");
            seen.push(m["tag"].parse::<u64>().unwrap());
        }
    }
    assert_eq!(seen, (1000..1048).collect::<Vec<_>>());
    let sb = b.stats();
    assert_eq!(sb["recvs"], 48);
    assert_eq!(sb["recv_posted"], 8);
    assert_eq!(sb["recv_errors"], 0);
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

#[test]
fn a_starved_receive_queue_is_reset_and_refilled() {
    let f = Fabric::start("starve");
    let mut a = f.agent("Hca2");
    let mut b = f.agent("Hca4");
    a.open(16, 8);
    let eb = b.open(8, 2);
    // From now on the driver refuses every receive B posts (a driver out of resources).
    assert!(f
        .ctl("Hca4", "set fail_post_recv 1000000")
        .starts_with("ok"));
    // 5 MADs take 5 of B's 8 posted buffers; none can be posted again. Five, not eight:
    // B resets its QP as soon as fewer than half its buffers are posted (after the fifth),
    // and a reset flushes what is still posted, so a sixth MAD could arrive into the reset
    // and be dropped, depending on when B polls.
    assert_eq!(
        a.cmd(&format!("send {} {} {} 100 5", eb.lid, eb.qpn, eb.gid)),
        "ok sent=5"
    );
    assert_eq!(a.cmd("poll"), "ok completions=5");
    assert_eq!(b.recv(5, 3000).len(), 5);
    // B sees its queue starved: it resets the QP to refill it, counted, and keeps trying
    // (the reset's own re-post is refused too).
    let t = Instant::now();
    loop {
        b.cmd("poll");
        let s = b.stats();
        if s["rq_starved"] >= 1 && s["qp_resets"] >= 1 {
            assert!(s["recv_posted"] < 4, "{s:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no reset: {s:?}");
    }
    // The driver recovers: the next poll posts every buffer again and traffic flows.
    assert!(f.ctl("Hca4", "set fail_post_recv 0").starts_with("ok"));
    b.cmd("poll");
    assert_eq!(b.stats()["recv_posted"], 8);
    assert_eq!(
        a.cmd(&format!("send {} {} {} 200 8", eb.lid, eb.qpn, eb.gid)),
        "ok sent=8"
    );
    let tags: Vec<String> = b.recv(8, 3000).iter().map(|m| m["tag"].clone()).collect();
    assert_eq!(tags.len(), 8, "B hears again: {tags:?}");
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

#[test]
fn oversized_datagram_resets_the_qp_and_traffic_resumes() {
    let f = Fabric::start("reset");
    let mut a = f.agent("Hca2");
    let mut b = f.agent("Hca4");
    let mut c = f.svagent("Hca3");
    let ea = a.open(16, 4);
    let eb = b.open(16, 4);
    // A plain libibverbs peer with the ACM Q_Key sends 300 bytes: larger than the 256-byte
    // receive buffers, so B's QP goes to the error state (IBV_WC_LOC_LEN_ERR, as on HCAs).
    let r = c.cmd("init 0x80010000 64");
    assert!(r.starts_with("ok "), "{r}");
    let big = "x".repeat(300);
    assert_eq!(
        c.cmd(&format!("send {} {} 0x80010000 {big}", eb.lid, eb.qpn)),
        "ok status=0"
    );
    // B notices, drains the flushed receives, resets the QP (same QPN) and re-posts.
    let t = Instant::now();
    loop {
        b.cmd("poll");
        let s = b.stats();
        if s["qp_resets"] == 1 && s["recv_posted"] == 16 {
            assert!(s["recv_errors"] >= 1, "{s:?}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no reset: {s:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        a.cmd(&format!("send {} {} {} 42", eb.lid, eb.qpn, eb.gid)),
        "ok sent=1"
    );
    let got = b.recv(1, 3000);
    assert_eq!(got.len(), 1, "nothing after the reset");
    assert_eq!(got[0]["tag"], "42");
    assert_eq!(got[0]["intact"], "1");
    // And B still sends (its send queue was reset too).
    assert_eq!(
        b.cmd(&format!("send {} {} {} 43", ea.lid, ea.qpn, ea.gid)),
        "ok sent=1"
    );
    assert_eq!(a.recv(1, 3000)[0]["tag"], "43");
    assert_eq!(b.cmd("poll"), "ok completions=1");
    assert_eq!(b.stats()["qp_resets"], 1);
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    drop(c);
}

#[test]
fn teardown_leaves_no_verbs_objects() {
    let f = Fabric::start("teardown");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    let ea = a.open(64, 8);
    let eb = b.open(64, 8);
    assert_eq!(a.cmd(&format!("attach 0 {MGID} {MLID}")), "ok");
    assert_eq!(b.cmd(&format!("attach 0 {MGID} {MLID}")), "ok");
    assert!(
        f.qp_socket_bound(ea.lid, ea.qpn),
        "QP socket not found (test broken)"
    );
    // Use everything: unicast AHs, the group AH, receives, events.
    assert_eq!(
        a.cmd(&format!("send {} {} {} 1 3", eb.lid, eb.qpn, eb.gid)),
        "ok sent=3"
    );
    assert_eq!(a.cmd("msend 0 10 2"), "ok sent=2");
    assert_eq!(b.recv(5, 3000).len(), 5);
    assert_eq!(
        b.cmd(&format!("send {} {} {} 20", ea.lid, ea.qpn, ea.gid)),
        "ok sent=1"
    );
    assert_eq!(a.recv(1, 3000).len(), 1);
    // A still has send completions unreaped and group membership: close must undo it all.
    let r = a.cmd("close");
    assert!(r.starts_with("ok "), "close: {r}");
    let fds: Vec<&str> = field(&r, "fds").split(',').collect();
    let threads: Vec<&str> = field(&r, "threads").split(',').collect();
    assert_eq!(fds[0], fds[1], "descriptors leaked: {r}");
    assert_eq!(threads[0], threads[1], "threads left running: {r}");
    assert!(
        !f.qp_socket_bound(ea.lid, ea.qpn),
        "QP still bound after close"
    );
    assert_eq!(
        f.mcast_members(MGID),
        vec![format!("{}.{}", eb.lid, eb.qpn)],
        "A's membership survived close"
    );
    // The device context is closed by quit (simverbs' close_device frees the context only if
    // it gets that far); exit code 0.
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    // B is dropped without close: the Drop path tears down, exit code 0.
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
    assert!(f.mcast_members(MGID).is_empty());
    assert!(!f.qp_socket_bound(eb.lid, eb.qpn));
}

/// Same life cycle under valgrind: no definitely-lost blocks (cheap enough: one agent, ~10 s).
#[test]
fn teardown_under_valgrind_loses_nothing() {
    assert!(
        std::process::Command::new("valgrind")
            .arg("--version")
            .output()
            .is_ok(),
        "valgrind not found: apt-get install valgrind (scripts/install-deps.sh installs it)"
    );
    let f = Fabric::start("valgrind");
    let log = f.dir.join("valgrind.log");
    let mut a = f.agent_valgrind("Hca3", &log);
    let mut b = f.agent("Hca4");
    let ea = a.open(32, 4);
    let eb = b.open(32, 4);
    assert_eq!(a.cmd(&format!("attach 0 {MGID} {MLID}")), "ok");
    assert_eq!(b.cmd(&format!("attach 0 {MGID} {MLID}")), "ok");
    assert_eq!(
        a.cmd(&format!("send {} {} {} 1 2", eb.lid, eb.qpn, eb.gid)),
        "ok sent=2"
    );
    assert_eq!(a.cmd("msend 0 5"), "ok sent=1");
    assert_eq!(b.recv(3, 5000).len(), 3);
    assert_eq!(
        b.cmd(&format!("send {} {} {} 9", ea.lid, ea.qpn, ea.gid)),
        "ok sent=1"
    );
    assert_eq!(a.recv(1, 10000).len(), 1);
    assert!(a.cmd("close").starts_with("ok "));
    let code = a.quit(Duration::from_secs(60));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(code, Some(0), "agent under valgrind failed:\n{text}");
    let (errors, summary) = text
        .split_once("HEAP SUMMARY")
        .unwrap_or_else(|| panic!("no valgrind summary:\n{text}"));
    assert!(summary.contains("definitely lost: 0 bytes"), "{text}");
    assert!(summary.contains("indirectly lost: 0 bytes"), "{text}");
    // Memory errors with our code on the stack (umad2sim and simverbs' SMP agent have a few of
    // their own, at device open: not ours to fix here).
    for block in errors.split("== \n") {
        assert!(
            !block.contains("acm_dataplane") && !block.contains("ud_agent"),
            "valgrind error in our code:\n{block}"
        );
    }
    let leaks: Vec<&str> = summary
        .split("== \n")
        .filter(|b| b.contains("lost in loss record"))
        .collect();
    for b in leaks {
        assert!(
            !b.contains("acm_dataplane") && !b.contains("ud_agent"),
            "leak from our code:\n{b}"
        );
    }
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

#[test]
fn unicast_ah_cache_evicts_and_never_destroys_an_ah_in_use() {
    let f = Fabric::start("ahcache");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    a.open(16, 40);
    let eb = b.open(64, 4);
    let dst = format!("{} {} {}", eb.lid, eb.qpn, eb.gid);
    // B drains every 8 MADs: simverbs' per-QP datagram socket holds net.unix.max_dgram_qlen
    // (10 on this machine) and a burst beyond that is lost, as congestion on a fabric would.
    let mut got = Vec::new();
    // 40 distinct AVs (flow labels 1..=40), each send reaped: 40 AHs made, 8 evicted (32 slots).
    for flow in 1..=40u64 {
        assert_eq!(a.cmd(&format!("send {dst} {flow} 1 {flow}")), "ok sent=1");
        assert_eq!(a.cmd("poll"), "ok completions=1");
        if flow % 8 == 0 {
            got.extend(b.recv(8, 3000));
        }
    }
    let st = a.stats();
    assert_eq!((st["ah_created"], st["ah_evicted"]), (40, 8), "{st:?}");
    // The most recent AV is still cached.
    assert_eq!(a.cmd(&format!("send {dst} 41 1 40")), "ok sent=1");
    assert_eq!(a.cmd("poll"), "ok completions=1");
    assert_eq!(a.stats()["ah_created"], 40);
    got.extend(b.recv(1, 3000));
    // 32 new AVs without reaping: every slot holds an AH a send in flight uses, so a 33rd AV
    // is refused (AhBusy), not served by destroying a busy AH.
    for flow in 100..132u64 {
        assert_eq!(a.cmd(&format!("send {dst} {flow} 1 {flow}")), "ok sent=1");
        if flow % 8 == 3 {
            got.extend(b.recv(8, 3000));
        }
    }
    let r = a.cmd(&format!("send {dst} 132 1 132"));
    assert!(r.starts_with("err sent=0 ah-busy"), "{r}");
    assert_eq!(a.stats()["ah_busy"], 1);
    assert_eq!(a.cmd("poll"), "ok completions=32");
    assert_eq!(a.cmd(&format!("send {dst} 132 1 132")), "ok sent=1");
    got.extend(b.recv(1, 3000));
    let tags: Vec<u64> = got.iter().map(|m| m["tag"].parse().unwrap()).collect();
    let want: Vec<u64> = (1..=41).chain(100..=132).collect();
    assert_eq!(tags, want);
    assert!(got.iter().all(|m| m["intact"] == "1"));
    let st = a.stats();
    assert_eq!(st["ah_created"], 73, "{st:?}");
    assert_eq!(st["ah_evicted"], 41, "{st:?}");
    assert_eq!(st["send_errors"], 1, "the refused send: {st:?}");
    assert!(a.cmd("close").starts_with("ok "));
    assert_eq!(a.quit(Duration::from_secs(5)), Some(0));
    assert_eq!(b.quit(Duration::from_secs(5)), Some(0));
}

#[test]
fn partition_endpoint_uses_its_pkey_index() {
    // Hca3 and Hca4 are full members of partition 0x0001; Hca2 only of the default one.
    let f = Fabric::start_with_partitions(
        "pkey",
        Some(
            "Default=0x7fff : ALL=full ;\n\
             part1=0x0001 : 0x0000000000100007=full, 0x000000000010000a=full ;\n",
        ),
    );
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    let mut c = f.agent("Hca2");
    // pkey_index() finds what OpenSM programmed (simverbs reads the table live).
    let r = a.cmd("open 16 4 0x8001");
    assert!(r.starts_with("ok "), "{r}");
    let pa = field(&r, "pkey_index").to_string();
    assert_ne!(pa, "0", "partition 0x8001 at index 0? {r}");
    let r = b.cmd("open 16 4 0x8001");
    assert!(r.starts_with("ok "), "{r}");
    let eb_lid = field(&r, "lid").to_string();
    let eb_qpn = field(&r, "qpn").to_string();
    let eb_gid = field(&r, "gid").to_string();
    let pb = field(&r, "pkey_index").to_string();
    assert!(c.cmd("open 16 4 0x8001").starts_with("err pkey 0x8001"));
    let ec = c.open(16, 4);
    assert_eq!(ec.pkey_index, 0);
    // Same partition: delivered; the receiver's RecvMeta carries its P_Key index, equal to
    // the endpoint's own (what the resolver checks).
    assert_eq!(
        a.cmd(&format!("send {eb_lid} {eb_qpn} {eb_gid} 7")),
        "ok sent=1"
    );
    let got = b.recv(1, 3000);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["pkey_index"], pb);
    assert_eq!(got[0]["ep_pkey_index"], pb);
    // Other partition: the receiving HCA drops it.
    assert_eq!(
        a.cmd(&format!("send {} {} {} 8", ec.lid, ec.qpn, ec.gid)),
        "ok sent=1"
    );
    assert!(c.recv(1, 500).is_empty());
    for n in [a, b, c] {
        assert_eq!(n.quit(Duration::from_secs(5)), Some(0));
    }
}
