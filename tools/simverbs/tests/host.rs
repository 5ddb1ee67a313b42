//! A simulated host of several CAs and ports, on two subnets (two ibsim instances, each with
//! its own OpenSM): verbs and umad see the same devices, ports, LIDs, GUIDs and prefixes; a
//! MAD sent on a port reaches that port's subnet; a request whose SA stopped answering times
//! out as the kernel's MAD layer makes it, while the other subnet keeps answering.

mod common;

use common::Fabric;
use std::time::{Duration, Instant};

const PREFIX_B: u64 = 0xfec0_0000_0000_0002;

fn run(c: &mut std::process::Command, what: &str) -> (bool, String) {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// (DLID, SLID, DestQP, MAD method) of every frame of an ERF pcap written by simverbs.
fn lrh_frames(pcap: &std::path::Path) -> Vec<(u16, u16, u32, u8)> {
    let b = std::fs::read(pcap).unwrap_or_else(|e| panic!("{}: {e}", pcap.display()));
    let mut out = Vec::new();
    let mut o = 24;
    while o + 16 <= b.len() {
        let len = u32::from_le_bytes([b[o + 8], b[o + 9], b[o + 10], b[o + 11]]) as usize;
        let fr = &b[o + 16..o + 16 + len];
        let be16 = |i: usize| u16::from_be_bytes([fr[i], fr[i + 1]]);
        // ERF header (16), LRH (8, no GRH), BTH (12: DestQP in bytes 5..8), DETH (8), the MAD.
        let dest_qp = u32::from_be_bytes([0, fr[24 + 5], fr[24 + 6], fr[24 + 7]]);
        out.push((be16(16 + 2), be16(16 + 6), dest_qp, fr[44 + 3]));
        o += 16 + len;
    }
    out
}

#[test]
fn two_cas_three_ports_on_two_subnets_agree_in_verbs_and_umad_and_time_out_per_subnet() {
    let a = Fabric::start("host-a");
    let b = Fabric::start_with("host-b", None, Some(PREFIX_B));
    // ibsim0: Hca3 and Hca4 of subnet A as ports 1 and 2; ibsim1: Hca2 of subnet B.
    let host = format!(
        "ibsim0:1={0}/Hca3,ibsim0:2={0}/Hca4,ibsim1:1={1}/Hca2",
        a.name, b.name
    );

    // Verbs: two devices, 2 + 1 ports, each port its node's LID and GUID, B's prefix.
    let (ok, dv) = run(
        a.host_command("ibv_devinfo", &host).arg("-v"),
        "ibv_devinfo",
    );
    assert!(ok, "{dv}");
    let devs: Vec<&str> = dv.split("hca_id:").skip(1).collect();
    assert_eq!(devs.len(), 2, "{dv}");
    assert!(devs[0].trim_start().starts_with("ibsim0"), "{dv}");
    assert!(devs[1].trim_start().starts_with("ibsim1"), "{dv}");
    let lids = |d: &str| -> Vec<String> {
        d.lines()
            .filter_map(|l| l.trim().strip_prefix("port_lid:"))
            .map(|v| v.trim().to_string())
            .collect()
    };
    assert_eq!(lids(devs[0]), ["5", "6"], "{dv}");
    assert_eq!(lids(devs[1]), ["4"], "{dv}");
    assert!(devs[0].contains("phys_port_cnt:\t\t\t2"), "{dv}");
    assert!(
        devs[0].contains("fe80:0000:0000:0000:0000:0000:0010:0007"),
        "{dv}"
    );
    assert!(
        devs[0].contains("fe80:0000:0000:0000:0000:0000:0010:000a"),
        "{dv}"
    );
    assert!(
        devs[1].contains("fec0:0000:0000:0002:0000:0000:0010:0004"),
        "{dv}"
    );

    // umad (the same library): the same CAs, ports, LIDs and port GUIDs.
    let (ok, st) = run(&mut a.host_command("ibstat", &host), "ibstat");
    assert!(ok, "{st}");
    let cas: Vec<&str> = st.split("CA '").skip(1).collect();
    assert_eq!(cas.len(), 2, "{st}");
    assert!(
        cas[0].starts_with("ibsim0'") && cas[0].contains("Number of ports: 2"),
        "{st}"
    );
    for (ca, port, lid, guid) in [
        (0, "Port 1:", "Base lid: 5", "Port GUID: 0x0000000000100007"),
        (0, "Port 2:", "Base lid: 6", "Port GUID: 0x000000000010000a"),
        (1, "Port 1:", "Base lid: 4", "Port GUID: 0x0000000000100004"),
    ] {
        let p = cas[ca]
            .split(port)
            .nth(1)
            .unwrap_or_else(|| panic!("{port}: {st}"));
        assert!(
            p.contains(lid) && p.contains(guid),
            "{port} of CA {ca}: {st}"
        );
    }

    // A multi-MAD answer (every NodeRecord of the subnet, one RMPP segment each) arrives
    // whole: umad acknowledges each segment to OpenSM's RMPP sender and reassembles them.
    let (ok, nr) = run(
        a.host_command("saquery", &host)
            .args(["-C", "ibsim0", "-P", "1"]),
        "saquery NodeRecords",
    );
    assert!(ok, "{nr}");
    assert_eq!(nr.matches("NodeRecord dump").count(), 6, "{nr}");

    // SA queries through each port reach that port's subnet: the path's SGID carries the
    // subnet's prefix and the port's GUID.
    let pcap = a.dir.join("port2.pcap");
    let (ok, pr) = run(
        a.host_command("saquery", &host)
            .env("SIMVERBS_PCAP", &pcap)
            .args(["-C", "ibsim0", "-P", "2", "-p", "--src-to-dst", "6:4"]),
        "saquery on ibsim0/2",
    );
    assert!(
        ok && pr.contains("sgid....................fe80::10:a"),
        "{pr}"
    );
    // The capture holds the umad traffic: saquery's GetTable left port 2 (SLID 6) for the SM
    // (LID 1), QP1 to QP1, its GetTableResp (one RMPP segment) came back to LID 6, and umad
    // acknowledged that segment (an RMPP ACK, method GetTable).
    assert_eq!(
        lrh_frames(&pcap),
        vec![(1, 6, 1, 0x12), (6, 1, 1, 0x92), (1, 6, 1, 0x12)],
        "(DLID, SLID, DestQP, method) of each captured frame"
    );
    // Through ibsim1 (subnet B): a path with B's prefix.
    let path_on_b = || {
        run(
            a.host_command("saquery", &host).args([
                "-C",
                "ibsim1",
                "-P",
                "1",
                "-p",
                "--src-to-dst",
                "4:6",
            ]),
            "saquery on ibsim1/1",
        )
    };
    let (ok, pr) = path_on_b();
    assert!(
        ok && pr.contains("sgid....................fec0::2:0:0:10:4"),
        "{pr}"
    );

    // Subnet A's SA stops answering: a query on ibsim0 times out (umad returns the request
    // with status ETIMEDOUT after its 200 ms, as the kernel does; under umad2sim it waited
    // for ever) and fails; subnet B answers all the while.
    a.pause_sm();
    let t = Instant::now();
    let (ok, out) = run(
        a.host_command("saquery", &host)
            .args(["-C", "ibsim0", "-P", "1", "-t", "200", "-g"]),
        "saquery with A's SM stopped",
    );
    let took = t.elapsed();
    let (ok_b, out_b) = path_on_b();
    a.resume_sm();
    assert!(!ok, "a query to a stopped SA must fail: {out}");
    assert!(
        took < Duration::from_secs(10),
        "failed only after {took:?}: {out}"
    );
    assert!(ok_b && out_b.contains("fec0::2:0:0:10:4"), "{out_b}");
    let (ok, out) = run(
        a.host_command("saquery", &host)
            .args(["-C", "ibsim0", "-P", "1", "-g"]),
        "saquery after SIGCONT",
    );
    assert!(ok && out.contains("MCMemberRecord"), "{out}");
    eprintln!("host: the stopped SA's query failed after {took:?}");
}

#[test]
fn a_bad_host_spec_gives_no_device_and_says_why() {
    let a = Fabric::start("host-bad");
    for (spec, why) in [
        ("ibsim0:2=x/Hca3", "expected port 1"),
        (
            &format!("ibsim0:1={}/NoSuchNode", a.name) as &str,
            "left out",
        ),
    ] {
        let (_, out) = run(&mut a.host_command("ibv_devinfo", spec), "ibv_devinfo");
        assert!(out.contains("No IB devices found"), "{spec}: {out}");
        assert!(out.contains(why), "{spec}: {out}");
    }
}
