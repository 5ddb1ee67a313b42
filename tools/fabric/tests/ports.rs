//! The daemons' `server_port`s: leases from a shared pool never collide, across threads and
//! processes, and a daemon that finds its port taken is restarted on another.
//!
//! The daemon test needs root, the Debian packages of docs/fabric.md and `libsimverbs.so`.

use acm_fabric::{Fabric, PortLease, PortPool, Provider, Topology};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// Set in the environment of the child processes of the lease test.
const CHILD: &str = "ACM_FABRIC_LEASE_TEST_CHILD";
const THREADS: usize = 4;
const PER_THREAD: usize = 8;
const CHILDREN: usize = 4;

/// `THREADS` threads, started together, each leasing `PER_THREAD` ports from `pool`.
fn lease_from_threads(pool: &PortPool) -> Vec<PortLease> {
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                (0..PER_THREAD)
                    .map(|_| pool.reserve().expect("lease"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().expect("lease thread"))
        .collect()
}

/// Not a test of its own: the body of the child processes of
/// `leases_are_unique_across_threads_and_processes` (a no-op unless `$CHILD` is set). Leases
/// ports from threads, prints them, and holds them until its stdin closes.
#[test]
fn lease_test_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    // The pool of the parent: `$ACM_FABRIC_PORT_DIR` and `$ACM_FABRIC_PORTS`.
    let pool = PortPool::shared().unwrap();
    let leases = lease_from_threads(&pool);
    let ports: Vec<String> = leases.iter().map(|l| l.port().to_string()).collect();
    // On a line of its own (libtest has printed `test lease_test_child ... ` already).
    println!("\nLEASED {}", ports.join(" "));
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
    drop(leases);
}

#[test]
fn leases_are_unique_across_threads_and_processes() {
    // A private lock directory and a small range of its own (below the shared default range,
    // outside the ephemeral range), so that the 5 processes × 32 leases (160 of 200 ports)
    // contend hard for the same lock files.
    let dir = std::env::temp_dir().join(format!("acmfab-leasetest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (first, last) = (23000u16, 23199u16);
    let pool = PortPool::new(&dir, first..=last).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "lease_test_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, "1")
                .env("ACM_FABRIC_PORT_DIR", &dir)
                .env("ACM_FABRIC_PORTS", format!("{first}-{last}"))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    // This process leases at the same time as the children.
    let mine = lease_from_threads(&pool);
    let mut owner: BTreeMap<u16, String> = BTreeMap::new();
    let mut dups = Vec::new();
    for l in &mine {
        if let Some(prev) = owner.insert(l.port(), "parent".into()) {
            dups.push((l.port(), prev, "parent".to_string()));
        }
    }
    // Every child prints its leases and keeps holding them: all 160 are held at once here.
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, c) in children.iter_mut().enumerate() {
        let (out, tx) = (c.stdout.take().unwrap(), tx.clone());
        std::thread::spawn(move || {
            let mut lines = BufReader::new(out).lines().map_while(|l| l.ok());
            let line = lines.by_ref().find(|l| l.starts_with("LEASED "));
            let _ = tx.send((i, line));
            lines.for_each(drop); // to EOF: the child's last words need a reader
        });
    }
    for _ in 0..CHILDREN {
        let got = rx.recv_timeout(Duration::from_secs(60));
        let Ok((i, Some(line))) = got else {
            for c in &mut children {
                let _ = c.kill(); // our own children, by handle
                let _ = c.wait();
            }
            panic!("a child printed no leases within 60 s: {got:?}");
        };
        let ports: Vec<u16> = line
            .split_whitespace()
            .skip(1)
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(ports.len(), THREADS * PER_THREAD, "child {i}: {line}");
        for p in ports {
            assert!((first..=last).contains(&p), "child {i}: {p}");
            if let Some(prev) = owner.insert(p, format!("child {i}")) {
                dups.push((p, prev, format!("child {i}")));
            }
        }
    }
    assert!(dups.is_empty(), "ports leased twice at once: {dups:?}");
    assert_eq!(owner.len(), (CHILDREN + 1) * THREADS * PER_THREAD);
    // While all are held, a bind confirms each leased port was free, and the pool has at
    // most the remaining 40 ports left.
    let mut more = Vec::new();
    while let Ok(l) = pool.reserve() {
        assert!(!owner.contains_key(&l.port()), "{} leased twice", l.port());
        more.push(l);
    }
    assert!(more.len() <= 200 - owner.len(), "{}", more.len());
    for c in &mut children {
        drop(c.stdin.take()); // releases the child
        assert!(c.wait().unwrap().success());
    }
    // Released with the processes: the whole range can be leased again.
    drop(more);
    drop(mine);
    let again: Vec<PortLease> = std::iter::from_fn(|| pool.reserve().ok()).collect();
    assert!(
        again.len() >= owner.len(),
        "{} leasable after release",
        again.len()
    );
    drop(again);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_daemon_whose_port_was_taken_is_restarted_on_another() {
    let mut f = Fabric::builder(
        Topology::example("net.2sw2path4hca").unwrap(),
        ["Hca3", "Hca4"],
    )
    .provider(Provider::Stock)
    .name_prefix("ports-stolen")
    .start()
    .unwrap_or_else(|e| panic!("bring-up failed: {e}"));
    let ports: Vec<u16> = f.nodes().iter().map(|n| n.server_port).collect();
    assert_ne!(ports[0], ports[1]);
    let pool = PortPool::shared().unwrap();
    for p in &ports {
        assert!(pool.range().contains(p), "{p} outside {:?}", pool.range());
    }

    // Someone outside the pool takes Hca3's port while its daemon is down.
    let old = ports[0];
    let hca3 = f.node_mut("Hca3").unwrap();
    hca3.stop_daemon();
    let thief = std::net::TcpListener::bind(("127.0.0.1", old)).expect("steal the port");
    hca3.restart_daemon()
        .unwrap_or_else(|e| panic!("restart failed: {e}"));
    let hca3 = f.node("Hca3").unwrap();
    let new = hca3.server_port;
    assert_ne!(new, old);
    assert_eq!(hca3.port_retries(), [old]);
    // The core said so (in the log of the failed run: each start moves the previous log to
    // ibacm.log.N, the core truncates it), and the daemon now serves on the new port.
    let earlier = hca3.earlier_logs();
    assert_eq!(earlier.len(), 2, "{earlier:?}"); // the first run, the failed one
    let failed = std::fs::read_to_string(&earlier[1]).unwrap();
    assert!(
        failed.contains("ERROR - unable to bind listen socket")
            && failed.contains(&format!("server_port {}", old as i16)),
        "{failed}"
    );
    assert!(!hca3.log().contains("unable to bind"), "{}", hca3.log());
    assert!(hca3.log().contains("listen active"), "{}", hca3.log());
    let opts = std::fs::read_to_string(hca3.dir.join("ibacm_opts.cfg")).unwrap();
    assert!(opts.contains(&format!("\nserver_port {new}\n")), "{opts}");
    let e = hca3.acme(&["-e"]).unwrap();
    assert!(e.stdout.contains(",ibacmp,hca3,"), "{e}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", new)).is_ok());
    // The new port and Hca4's are leased (the pool gives them to no one); the given-up one
    // is not (only the thief's bind keeps the pool from handing it out).
    for p in [new, ports[1]] {
        let one = PortPool::new(pool.dir(), p..=p).unwrap();
        assert!(one.reserve().is_err(), "{p} leasable while in use");
    }
    let one = PortPool::new(pool.dir(), old..=old).unwrap();
    assert!(
        one.reserve().is_err(),
        "{old} leasable while the thief holds it"
    );
    drop(thief);
    assert_eq!(one.reserve().unwrap().port(), old);
    // It resolves as before.
    let (l3, l4) = (
        hca3.lid.to_string(),
        f.node("Hca4").unwrap().lid.to_string(),
    );
    let out = hca3
        .acme_until(
            &["-f", "l", "-s", &l3, "-d", &l4, "-v"],
            Duration::from_secs(10),
            |o| o.stdout.contains("SA verification: success"),
        )
        .unwrap();
    assert!(out.stdout.contains("SA verification: success"), "{out}");
}
