//! simverbs against real programs on a real simulated fabric (ibsim + OpenSM + umad2sim):
//! `ibv_devinfo`, a C libibverbs agent (tests/c/svagent.c) and the real ibacm daemon with the
//! stock libibacmp provider (started through `acm-fabric`).

mod common;
use common::{control, field, Fabric};
use std::time::Duration;

const QKEY: u32 = 0x1111_1111;
const MGID: &str = "ff154001ffff00000000000000000001";
const MLID: u16 = 0xc010;

/// Sends `sig` (e.g. `-STOP`) to a process this test started, by PID.
fn signal(pid: u32, sig: &str) {
    let st = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill {sig} {pid}");
}

/// Value after `key:` on a line of tool output, trimmed.
fn value_of(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key).map(|r| r.trim().to_string()))
        .unwrap_or_else(|| panic!("'{key}' not found in:\n{text}"))
}

#[test]
fn devinfo_matches_umad_view() {
    let f = Fabric::start("devinfo");
    let devinfo = |subnet_timeout: Option<&str>| {
        let mut c = f.command("ibv_devinfo", "Hca3", true);
        c.arg("-v").env_remove("SIMVERBS_SUBNET_TIMEOUT");
        if let Some(v) = subnet_timeout {
            c.env("SIMVERBS_SUBNET_TIMEOUT", v);
        }
        let out = c
            .output()
            .expect("ibv_devinfo not found: apt-get install ibverbs-utils");
        let dev = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "ibv_devinfo failed: {dev}");
        (dev, String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (dev, _) = devinfo(None);
    let out = f
        .command("ibstat", "Hca3", false)
        .output()
        .expect("ibstat not found: apt-get install infiniband-diags");
    let stat = String::from_utf8_lossy(&out.stdout).to_string();

    assert_eq!(value_of(&dev, "hca_id:"), "ibsim0");
    let guid = |s: String| {
        u64::from_str_radix(s.replace([':', 'x'], "").trim_start_matches('0'), 16).unwrap_or(0)
    };
    let node_guid = guid(value_of(&stat, "Node GUID:"));
    assert_ne!(node_guid, 0);
    assert_eq!(guid(value_of(&dev, "node_guid:")), node_guid);
    assert_eq!(
        guid(value_of(&dev, "sys_image_guid:")),
        guid(value_of(&stat, "System image GUID:"))
    );
    assert_eq!(value_of(&dev, "port_lid:"), value_of(&stat, "Base lid:"));
    assert_eq!(value_of(&dev, "sm_lid:"), value_of(&stat, "SM lid:"));
    assert_eq!(
        value_of(&dev, "port_lmc:"),
        format!("0x{:02x}", value_of(&stat, "LMC:").parse::<u8>().unwrap())
    );
    assert_eq!(value_of(&stat, "State:"), "Active");
    assert_eq!(value_of(&dev, "state:"), "PORT_ACTIVE (4)");
    assert_eq!(value_of(&dev, "phys_state:"), "LINK_UP (5)");
    assert_eq!(value_of(&dev, "link_layer:"), "InfiniBand");
    // GID 0 = fe80::/64 prefix + port GUID.
    let port_guid = guid(value_of(&stat, "Port GUID:"));
    let gid0 = value_of(&dev, "GID[  0]:");
    assert!(gid0.starts_with("fe80:0000:0000:0000:"), "{gid0}");
    assert_eq!(guid(gid0[20..].to_string()), port_guid);
    // Rate 10 Gb/s = 4X SDR.
    assert_eq!(value_of(&stat, "Rate:"), "10");
    assert_eq!(value_of(&dev, "active_width:"), "4X (2)");
    assert_eq!(value_of(&dev, "active_speed:"), "2.5 Gbps (1)");

    // SubnetTimeOut: the fabric (ibsim) says 31, ibv_query_port reports OpenSM's default 18,
    // unless SIMVERBS_SUBNET_TIMEOUT overrides it; a bad override is reported and ignored.
    let out = f
        .command("smpquery", "Hca3", false)
        .args(["-D", "portinfo", "0", "1"])
        .output()
        .expect("smpquery not found: apt-get install infiniband-diags");
    let pi = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        value_of(&pi, "SubnetTimeout:").trim_start_matches('.'),
        "31"
    );
    assert_eq!(value_of(&dev, "subnet_timeout:"), "18");
    // SM SL and MTUs: what the live PortInfo of the node says.
    let dots = |key: &str| value_of(&pi, key).trim_start_matches('.').to_string();
    assert_eq!(value_of(&dev, "sm_sl:"), dots("SMSL:"), "{dev}\n{pi}");
    let mtu = |key: &str| value_of(&dev, key).split(' ').next().unwrap().to_string();
    assert_eq!(mtu("active_mtu:"), dots("NeighborMTU:"), "{dev}\n{pi}");
    assert_eq!(mtu("max_mtu:"), dots("MtuCap:"), "{dev}\n{pi}");
    let (dev8, _) = devinfo(Some("8"));
    assert_eq!(value_of(&dev8, "subnet_timeout:"), "8");
    let (dev_bad, err) = devinfo(Some("32"));
    assert_eq!(value_of(&dev_bad, "subnet_timeout:"), "18");
    assert!(
        err.contains("ignoring SIMVERBS_SUBNET_TIMEOUT") && err.contains("0..31"),
        "{err}"
    );
}

#[test]
fn ud_unicast_checks_and_cq_overflow() {
    let f = Fabric::start("ud");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    let (alid, aqpn, agid) = a.init(QKEY, 64);
    let (blid, bqpn, bgid) = b.init(QKEY, 64);
    assert_ne!(alid, blid);
    assert_ne!(agid, bgid);

    // Ping-pong, with immediate data.
    assert_eq!(a.cmd("recv 16"), "ok");
    assert_eq!(b.cmd("recv 16"), "ok");
    for i in 0..10 {
        assert_eq!(
            a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} ping{i} {i}")),
            "ok status=0"
        );
        let wc = b.cmd("wait 3000");
        assert_eq!(field(&wc, "status"), Some("0"), "{wc}");
        assert_eq!(
            field(&wc, "data"),
            Some(format!("ping{i}").as_str()),
            "{wc}"
        );
        assert_eq!(
            field(&wc, "len").unwrap(),
            (40 + format!("ping{i}").len()).to_string()
        );
        assert_eq!(field(&wc, "src_qp").unwrap(), aqpn.to_string());
        assert_eq!(field(&wc, "qp").unwrap(), bqpn.to_string());
        assert_eq!(field(&wc, "slid").unwrap(), alid.to_string());
        assert_eq!(field(&wc, "sl"), Some("2"));
        // LMC 0: no path bits; default partition at P_Key index 0 (the agent pre-fills the WC
        // with 0xa5 bytes, so unwritten fields would show).
        assert_eq!(field(&wc, "path_bits"), Some("0"), "{wc}");
        assert_eq!(field(&wc, "pkey_index"), Some("0"), "{wc}");
        assert_eq!(field(&wc, "grh"), Some("0"));
        assert_eq!(field(&wc, "imm").unwrap(), i.to_string());
        assert_eq!(
            b.cmd(&format!("send {alid} {aqpn} {QKEY:#x} pong{i}")),
            "ok status=0"
        );
        let wc = a.cmd("wait 3000");
        assert_eq!(
            field(&wc, "data"),
            Some(format!("pong{i}").as_str()),
            "{wc}"
        );
        assert_eq!(field(&wc, "imm"), Some("none:0"), "{wc}");
    }

    // A wrong Q_Key is dropped by the receiver; a remote_qkey with the MSB set means "use the
    // sending QP's own Q_Key" (equal here), so that one arrives.
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} 0x22222222 wrongkey")),
        "ok status=0"
    );
    assert_eq!(b.cmd("wait 500"), "timeout");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} 0x80000000 msbkey")),
        "ok status=0"
    );
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("msbkey"));

    // A peer that does not drain its socket (stopped) or is gone never blocks the sender.
    signal(b.pid(), "-STOP");
    let t = std::time::Instant::now();
    assert_eq!(
        a.cmd(&format!("flood {blid} {bqpn} {QKEY:#x} 2000")),
        "ok status=0"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "sender was slowed down by a stopped peer"
    );
    signal(b.pid(), "-CONT");
    // b's 16 - 11 remaining receives were used up by the flood; repost and check it still works.
    assert_eq!(b.cmd("recv 16"), "ok");
    while b.cmd("wait 200") != "timeout" {}
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} after-flood")),
        "ok status=0"
    );
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("after-flood"));

    // A wrong destination QPN reaches nobody.
    assert_eq!(
        a.cmd(&format!("send {blid} {} {QKEY:#x} nobody", bqpn + 99999)),
        "ok status=0"
    );
    assert_eq!(b.cmd("wait 300"), "timeout");

    // Send gathering past the end of the MR: local protection error (4), nothing sent, and
    // the QP is in the error state afterwards (later sends are flushed, status 5).
    assert_eq!(
        a.cmd(&format!("sendbad {blid} {bqpn} {QKEY:#x}")),
        "ok status=4"
    );
    assert_eq!(b.cmd("wait 300"), "timeout");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} flushed")),
        "ok status=5"
    );
    assert_eq!(b.cmd("wait 300"), "timeout");

    // CQ overflow: a third node with a 2-entry receive CQ gets 4 datagrams.
    let mut c = f.agent("Hca2");
    let (clid, cqpn, _) = c.init(QKEY, 2);
    assert_eq!(c.cmd("recv 8"), "ok");
    for i in 0..4 {
        assert_eq!(
            b.cmd(&format!("send {clid} {cqpn} {QKEY:#x} flood{i}")),
            "ok status=0"
        );
    }
    let ev = c.cmd("async 3000");
    assert_eq!(ev, "async CQ error rcq");
    // The two that fit are still there; after the overrun the CQ is in error, as on hardware:
    // a later datagram (a receive is still posted) never completes.
    for i in 0..2 {
        assert_eq!(
            field(&c.cmd("wait 3000"), "data"),
            Some(format!("flood{i}").as_str())
        );
    }
    assert_eq!(
        b.cmd(&format!("send {clid} {cqpn} {QKEY:#x} after-overrun")),
        "ok status=0"
    );
    assert_eq!(c.cmd("wait 500"), "timeout");

    // Receive buffer reaching past the MR: the datagram completes with a protection error.
    assert_eq!(b.cmd("recvbad"), "ok");
    // b still has its earlier receives posted first; use them up.
    let mut saw_prot = false;
    for i in 0..20 {
        assert_eq!(
            c.cmd(&format!("send {blid} {bqpn} {QKEY:#x} fill{i}")),
            "ok status=0"
        );
        let wc = b.cmd("wait 3000");
        if field(&wc, "status") == Some("4") {
            saw_prot = true;
            break;
        }
        assert_eq!(field(&wc, "status"), Some("0"), "{wc}");
    }
    assert!(saw_prot, "receive past the MR never failed");
    // The receive error moved b's QP to the error state: its next receive is flushed.
    assert_eq!(b.cmd("recv 1"), "ok");
    assert_eq!(field(&b.cmd("wait 3000"), "status"), Some("5"));

    assert_eq!(a.quit(), Some(0));
    assert_eq!(b.quit(), Some(0));
    assert_eq!(c.quit(), Some(0));
}

#[test]
fn multicast_to_three_members_with_grh() {
    let f = Fabric::start("mcast");
    let mut nodes: Vec<_> = ["Hca2", "Hca3", "Hca4"]
        .iter()
        .map(|h| f.agent(h))
        .collect();
    let ids: Vec<_> = nodes.iter_mut().map(|n| n.init(QKEY, 64)).collect();
    for n in nodes.iter_mut() {
        assert_eq!(n.cmd("recv 8"), "ok");
        assert_eq!(n.cmd(&format!("attach {MGID} {MLID}")), "ok");
    }
    // Not a multicast GID / not a multicast LID: refused.
    assert_ne!(
        nodes[0].cmd(&format!("attach fe800000000000000000000000000001 {MLID}")),
        "ok"
    );
    assert_ne!(nodes[0].cmd(&format!("attach {MGID} 5")), "ok");

    assert_eq!(
        nodes[0].cmd(&format!("msend {MLID} {MGID} {QKEY:#x} hello-group")),
        "ok status=0"
    );
    for (i, n) in nodes.iter_mut().enumerate().skip(1) {
        let wc = n.cmd("wait 3000");
        assert_eq!(field(&wc, "status"), Some("0"), "{wc}");
        assert_eq!(field(&wc, "data"), Some("hello-group"), "{wc}");
        assert_eq!(field(&wc, "grh"), Some("1"), "{wc}");
        assert_eq!(
            field(&wc, "sgid"),
            Some(ids[0].2.as_str()),
            "GRH source GID: {wc}"
        );
        assert_eq!(field(&wc, "dgid"), Some(MGID), "GRH destination GID: {wc}");
        assert_eq!(field(&wc, "src_qp").unwrap(), ids[0].1.to_string());
        assert_eq!(field(&wc, "slid").unwrap(), ids[0].0.to_string());
        assert_eq!(field(&wc, "qp").unwrap(), ids[i].1.to_string());
    }
    // The sending QP does not receive its own multicast.
    assert_eq!(nodes[0].cmd("wait 300"), "timeout");

    // After a detach only the remaining member receives.
    assert_eq!(nodes[2].cmd(&format!("detach {MGID} {MLID}")), "ok");
    assert_eq!(
        nodes[0].cmd(&format!("msend {MLID} {MGID} {QKEY:#x} second")),
        "ok status=0"
    );
    assert_eq!(field(&nodes[1].cmd("wait 3000"), "data"), Some("second"));
    assert_eq!(nodes[2].cmd("wait 300"), "timeout");

    // A member whose process died is skipped (and pruned) without hanging the sender.
    let dead = nodes.remove(1);
    drop(dead); // killed by PID, its membership file stays behind
    assert_eq!(
        nodes[0].cmd(&format!("msend {MLID} {MGID} {QKEY:#x} to-the-dead")),
        "ok status=0"
    );
    for n in nodes {
        assert_eq!(n.quit(), Some(0));
    }
}

#[test]
fn control_socket_events_and_loss_knob() {
    let f = Fabric::start("ctl");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    a.init(QKEY, 64);
    let (blid, bqpn, _) = b.init(QKEY, 64);
    assert!(control(&f.name, "Hca3", "ping").starts_with("ok pong"));
    assert_eq!(a.cmd("async 200"), "timeout");
    assert_eq!(
        control(&f.name, "Hca3", "event client_reregister"),
        "ok 1 context(s)"
    );
    assert_eq!(a.cmd("async 2000"), "async client reregistration 1");
    assert_eq!(
        control(&f.name, "Hca3", "event sm_change"),
        "ok 1 context(s)"
    );
    assert_eq!(a.cmd("async 2000"), "async SM change 1");
    assert!(control(&f.name, "Hca3", "event bogus").starts_with("err"));
    assert!(control(&f.name, "Hca3", "set loss 2").starts_with("err"));

    // loss=1 on the sender: nothing arrives; back to 0: it does.
    assert_eq!(b.cmd("recv 4"), "ok");
    assert_eq!(control(&f.name, "Hca3", "set loss 1"), "ok");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} lost")),
        "ok status=0"
    );
    assert_eq!(b.cmd("wait 300"), "timeout");
    assert_eq!(control(&f.name, "Hca3", "set loss 0"), "ok");
    // delay_ms: still delivered, later.
    assert_eq!(control(&f.name, "Hca3", "set delay_ms 200"), "ok");
    let t = std::time::Instant::now();
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} late")),
        "ok status=0"
    );
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("late"));
    assert!(t.elapsed() >= Duration::from_millis(190));
    assert!(control(&f.name, "Hca3", "get").contains("delay_ms=200"));
    // dup=1: every datagram arrives twice.
    assert_eq!(control(&f.name, "Hca3", "set delay_ms 0"), "ok");
    assert_eq!(control(&f.name, "Hca3", "set dup 1"), "ok");
    assert_eq!(b.cmd("recv 4"), "ok");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} twice")),
        "ok status=0"
    );
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("twice"));
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("twice"));
    assert_eq!(b.cmd("wait 300"), "timeout");
    // reorder: a datagram picked for reordering is held back, the next one overtakes it.
    assert_eq!(control(&f.name, "Hca3", "set dup 0"), "ok");
    assert_eq!(b.cmd("recv 4"), "ok");
    assert_eq!(control(&f.name, "Hca3", "set reorder 1"), "ok");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} first")),
        "ok status=0"
    );
    assert_eq!(control(&f.name, "Hca3", "set reorder 0"), "ok");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} second")),
        "ok status=0"
    );
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("second"));
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("first"));
    assert_eq!(a.quit(), Some(0));
    assert_eq!(b.quit(), Some(0));
}

/// True when this machine lets us give a process a private /run (`unshare -m` + bind mount:
/// root with CAP_SYS_ADMIN), which the ibacm test needs (ibacm always writes /run files).
fn can_private_run() -> bool {
    std::process::Command::new("unshare")
        .args(["-m", "sh", "-c", "mount --bind /tmp /run"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn wait_for_log(path: &std::path::Path, needle: &str) {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if std::fs::read_to_string(path)
            .unwrap_or_default()
            .contains(needle)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "'{needle}' not in {}:\n{}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
}

/// The real ibacm daemon with the stock libibacmp on Hca3 and Hca4, brought up (private
/// `/run`, opts/addr files, teardown by PID) by the `acm-fabric` orchestrator over this
/// build's libsimverbs.so.
#[test]
fn real_ibacm_with_stock_provider_resolves() {
    assert!(
        can_private_run(),
        "real_ibacm_with_stock_provider_resolves needs `unshare -m` + bind mounts (root with \
         CAP_SYS_ADMIN) to give each ibacm a private /run; run it as root, as scripts/test.sh \
         and CI do"
    );
    let topology = acm_fabric::Topology::example("net.2sw2path4hca").expect("shipped topology");
    let f = acm_fabric::Fabric::builder(topology, ["Hca3", "Hca4"])
        .provider(acm_fabric::Provider::Stock)
        .simverbs(common::libsimverbs())
        .name_prefix("svt-ibacm")
        .start()
        .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let (h3, h4) = (f.node("Hca3").unwrap(), f.node("Hca4").unwrap());
    // The stock provider joined its multicast group through OpenSM's SA and attached its QP.
    for n in [h3, h4] {
        wait_for_log(&n.log_path(), "acmp_process_join_resp: join successful");
    }
    // hca3 -> hca4: an ACM address request multicast by Hca3's libibacmp, answered by
    // Hca4's over unicast, then a PathRecord from the SA.
    let out = h3
        .acme_until(
            &["-f", "n", "-s", "hca3", "-d", "hca4", "-v"],
            Duration::from_secs(15),
            |o| o.stdout.contains("SA verification: success"),
        )
        .expect("ib_acme");
    assert!(out.stdout.contains("SA verification: success"), "{out}");
    assert!(out.stdout.contains(&format!("dlid: {}\n", h4.lid)), "{out}");
    wait_for_log(&h4.log_path(), "acmp_process_addr_req");
    let out = h3.acme(&["-e"]).expect("ib_acme -e");
    assert!(out.stdout.contains("ibacmp,hca3"), "{out}");
}

#[test]
fn sm_move_on_the_fabric_raises_sm_change() {
    let mut f = Fabric::start("smmove");
    let mut a = f.agent("Hca3");
    a.init(QKEY, 64);
    assert_eq!(a.cmd("async 300"), "timeout");
    // No control command here: the monitor thread sees PortInfo.MasterSMLID change.
    f.move_sm("Hca2", "Hca4");
    assert_eq!(a.cmd("async 10000"), "async SM change 1");
    assert_eq!(a.quit(), Some(0));
}

/// Reads async events until `want` arrives (other events may come first).
fn wait_event(a: &mut common::Agent, want: &str) {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        let ev = a.cmd("async 1000");
        if ev == want {
            return;
        }
    }
    panic!("no '{want}' on {}", a.host);
}

#[test]
fn port_down_on_the_fabric_raises_port_err_and_stops_traffic() {
    let f = Fabric::start("portdown");
    let mut a = f.agent("Hca3");
    let mut b = f.agent("Hca4");
    let (alid, aqpn, _) = a.init(QKEY, 64);
    let (blid, bqpn, _) = b.init(QKEY, 64);
    assert_eq!(a.cmd("recv 8"), "ok");
    assert_eq!(b.cmd("recv 8"), "ok");
    let send = |from: &mut common::Agent, lid: u16, qpn: u32, data: &str| {
        assert_eq!(
            from.cmd(&format!("send {lid} {qpn} {QKEY:#x} {data}")),
            "ok status=0"
        );
    };
    send(&mut b, alid, aqpn, "before");
    assert_eq!(field(&a.cmd("wait 3000"), "data"), Some("before"));

    // ibsim unlinks Hca3's cable: its PortInfo reads Down, the monitor raises PORT_ERR and
    // ibv_query_port says so; nothing reaches the down port, nothing leaves it (the sends
    // still complete successfully, as UD sends into a dead link do).
    f.port_down("Hca3");
    wait_event(&mut a, "async port error 1");
    let port = a.cmd("port");
    assert_eq!(
        port.split_whitespace().nth(3),
        Some("1"),
        "state DOWN: {port}"
    );
    send(&mut b, alid, aqpn, "to-down");
    assert_eq!(a.cmd("wait 300"), "timeout");
    send(&mut a, blid, bqpn, "from-down");
    assert_eq!(b.cmd("wait 300"), "timeout");

    // Relinked, the SM makes it ACTIVE again: PORT_ACTIVE, same LID, traffic flows both ways.
    f.port_up("Hca3");
    wait_event(&mut a, "async port active 1");
    send(&mut b, alid, aqpn, "after");
    assert_eq!(field(&a.cmd("wait 3000"), "data"), Some("after"));
    send(&mut a, blid, bqpn, "back");
    assert_eq!(field(&b.cmd("wait 3000"), "data"), Some("back"));
    assert_eq!(a.quit(), Some(0));
    assert_eq!(b.quit(), Some(0));
}

#[test]
fn lid_change_on_the_fabric_moves_the_qp() {
    let mut f = Fabric::start("lidchg");
    // Hca1 shares its node with the first OpenSM; its LID changes when the SM moves with -r.
    let mut a = f.agent("Hca1");
    let mut b = f.agent("Hca4");
    let (alid, aqpn, _) = a.init(QKEY, 64);
    let (blid, bqpn, _) = b.init(QKEY, 64);
    assert_eq!(a.cmd("recv 8"), "ok");
    assert_eq!(
        b.cmd(&format!("send {alid} {aqpn} {QKEY:#x} before")),
        "ok status=0"
    );
    assert_eq!(field(&a.cmd("wait 3000"), "data"), Some("before"));

    f.move_sm_reassigning_lids("Hca2", "Hca4");
    wait_event(&mut a, "async LID change 1");
    let port = a.cmd("port");
    let new_alid: u16 = port
        .split_whitespace()
        .nth(1)
        .and_then(|l| l.parse().ok())
        .expect(&port);
    assert_ne!(new_alid, alid, "{port}");
    // The QP moved with the port: reachable at the new LID, not at the old one.
    assert_eq!(
        b.cmd(&format!("send {new_alid} {aqpn} {QKEY:#x} after")),
        "ok status=0"
    );
    assert_eq!(field(&a.cmd("wait 3000"), "data"), Some("after"));
    assert_eq!(
        b.cmd(&format!("send {alid} {aqpn} {QKEY:#x} old-lid")),
        "ok status=0"
    );
    assert_eq!(a.cmd("wait 300"), "timeout");
    // And its datagrams carry the new SLID.
    assert_eq!(b.cmd("recv 2"), "ok");
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} from-new")),
        "ok status=0"
    );
    assert_eq!(
        field(&b.cmd("wait 3000"), "slid").unwrap(),
        new_alid.to_string()
    );
    assert_eq!(a.quit(), Some(0));
    assert_eq!(b.quit(), Some(0));
}

#[test]
fn pkey_partitions_from_opensm_are_enforced() {
    // Hca3 and Hca4 are full members of partition 0x0001; Hca2 is only in the default one.
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
    // The P_Key tables OpenSM programmed are what ibv_get_pkey_index sees (live SMP read).
    let (_, _, _) = a.init_pkey(QKEY, 64, "0x8001");
    let (blid, bqpn, _) = b.init_pkey(QKEY, 64, "0x8001");
    assert!(c
        .cmd(&format!("init {QKEY:#x} 64 0x8001"))
        .starts_with("err pkey"));
    drop(c);
    let mut c = f.agent("Hca2");
    let (clid, cqpn, _) = c.init(QKEY, 64);
    assert_eq!(b.cmd("recv 4"), "ok");
    assert_eq!(c.cmd("recv 4"), "ok");
    // Same partition: delivered, with the receiver's P_Key index.
    assert_eq!(
        a.cmd(&format!("send {blid} {bqpn} {QKEY:#x} member")),
        "ok status=0"
    );
    let wc = b.cmd("wait 3000");
    assert_eq!(field(&wc, "data"), Some("member"), "{wc}");
    assert_ne!(field(&wc, "pkey_index"), Some("0"), "{wc}");
    // Other partition: dropped by the receiving HCA.
    assert_eq!(
        a.cmd(&format!("send {clid} {cqpn} {QKEY:#x} outsider")),
        "ok status=0"
    );
    assert_eq!(c.cmd("wait 500"), "timeout");
    assert_eq!(a.quit(), Some(0));
    assert_eq!(b.quit(), Some(0));
    assert_eq!(c.quit(), Some(0));
}

#[test]
fn two_fabrics_side_by_side_do_not_cross_talk() {
    // Same topology, so Hca4 has the same LID in both fabrics; only the fabric name differs.
    let fa = Fabric::start("sidea");
    let fb = Fabric::start("sideb");
    assert_ne!(fa.name, fb.name);
    let mut a3 = fa.agent("Hca3");
    let mut a4 = fa.agent("Hca4");
    let mut b4 = fb.agent("Hca4");
    a3.init(QKEY, 64);
    let (a4lid, a4qpn, _) = a4.init(QKEY, 64);
    let (b4lid, b4qpn, _) = b4.init(QKEY, 64);
    assert_eq!(a4lid, b4lid, "same topology, same LIDs");
    assert_eq!(a4.cmd("recv 8"), "ok");
    assert_eq!(b4.cmd("recv 8"), "ok");
    // Addressed to fabric B's QP (LID + QPN), sent in fabric A: lost, B never sees it.
    assert_eq!(
        a3.cmd(&format!("send {b4lid} {b4qpn} {QKEY:#x} wrong-fabric")),
        "ok status=0"
    );
    assert_eq!(b4.cmd("wait 500"), "timeout");
    // The same sender reaches its own fabric's Hca4, and only that one.
    assert_eq!(
        a3.cmd(&format!("send {a4lid} {a4qpn} {QKEY:#x} own-fabric")),
        "ok status=0"
    );
    assert_eq!(field(&a4.cmd("wait 3000"), "data"), Some("own-fabric"));
    assert_eq!(b4.cmd("wait 300"), "timeout");
    for ag in [a3, a4, b4] {
        assert_eq!(ag.quit(), Some(0));
    }
}
