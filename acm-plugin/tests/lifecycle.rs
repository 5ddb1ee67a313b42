//! Loading, options, and the life cycle the core drives: endpoint close with requests
//! waiting, port change (close everything, reopen with a new LID), endpoint reopen,
//! CLIENT_REREGISTER, shutdown with requests in flight.

use acm_core_nostd::wire::client::Status;
use acm_testkit::core::*;
use acm_testkit::host::*;
use acm_testkit::request::*;
use acmrs::ffi::*;
use std::sync::atomic::Ordering;

const OPTS: &str = "\
log_level 2
timeout 100
retries 0
route_timeout -1
acmrs_sa_window_start 4096
";

#[test]
fn provider_table_and_exports() {
    let lib = lib();
    assert_eq!(lib.prov.size, 120);
    assert_eq!(lib.prov.version, 1);
    // SAFETY: static NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(lib.prov.name) };
    assert_eq!(name.to_str().unwrap(), "acmrs");
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib.path)
        .output()
        .expect("nm (binutils) must be installed");
    let text = String::from_utf8_lossy(&out.stdout);
    let funcs: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" T ") || l.contains(" D ") || l.contains(" B "))
        .filter_map(|l| l.rsplit(' ').next())
        .collect();
    // The library next to this test is built with the same profile: a debug build also exports
    // its virtual clock for the tests (the release build is checked in tests/real_ibacm.rs).
    let want: &[&str] = if cfg!(debug_assertions) {
        &[
            "acmrs_test_advance_clock",
            "acmrs_test_stall",
            "provider_query",
        ]
    } else {
        &["provider_query"]
    };
    assert_eq!(funcs, want, "exports");
    let undef = std::process::Command::new("nm")
        .args(["-D", "--undefined-only"])
        .arg(&lib.path)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&undef.stdout).contains("acm_"),
        "core helpers must not be linked"
    );
    // The fake core is what the library bound to (this executable exports it).
    assert!(exported());
}

#[test]
fn provider_query_refuses_host_without_core_helpers() {
    let dir = std::env::temp_dir().join(format!("acmrs-nohelpers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("h.c");
    std::fs::write(
        &src,
        "#include <dlfcn.h>\n#include <stdio.h>\n#include <stdint.h>\n\
         int main(int c, char **v) { void *h = dlopen(v[1], RTLD_LAZY); if (!h) return 2;\n\
         int (*q)(void **, uint32_t *) = dlsym(h, \"provider_query\"); if (!q) return 3;\n\
         void *p = 0; uint32_t ver = 0; int rc = q(&p, &ver); printf(\"rc=%d\\n\", rc);\n\
         return rc == 0 ? 4 : 0; }\n",
    )
    .unwrap();
    let exe = dir.join("h");
    let cc = std::process::Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("cc");
    assert!(cc.success());
    let out = std::process::Command::new(&exe)
        .arg(test_so_path())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("acm_write"), "stderr: {stderr}");
    assert!(
        stderr.contains("must be loaded by ibacm"),
        "stderr: {stderr}"
    );
}

/// An invalid value is reported with its line (the default kept); unknown names (other
/// providers' options) are ignored silently.
#[test]
fn options_are_validated() {
    let _s = serial();
    let opts = format!("{OPTS}acmrs_cpu banana\nsome_other_provider_option 5\n");
    let line = opts.lines().count() - 1;
    let mut h = Host::open(&opts, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(
        log_contains(&format!("ibacm_opts.cfg line {line}: invalid number")),
        "invalid acmrs_cpu reported"
    );
    assert!(!log_contains("some_other_provider_option"));
    // The instance runs with the default kept.
    let t = h.tid();
    h.resolve(ep, &path_request(t, 50, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    assert_eq!(find(t)[0].status(), Status::Success);
    h.close();
}

/// `route_prot acm` needs the endpoint's UD QP, which this fake core cannot give: the
/// endpoint says so and serves PATH requests through the SA only. An endpoint without a UD QP
/// has nothing to attach to a multicast group, so it must not join one (an MCMemberRecord SET
/// the SM would register, retried with backoff for ever when unanswered).
#[test]
fn an_sa_only_endpoint_sends_no_multicast_join() {
    let _s = serial();
    let mut h = Host::open(&format!("{OPTS}route_prot acm\n"), &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    assert!(log_contains("no ACM protocol"), "SA-only endpoint reported");
    let t = h.tid();
    h.resolve(ep, &path_request(t, 50, None, 0), 1);
    // The PATH request's query is the only MAD: the endpoint's open and the request were
    // both taken in once the query is there.
    assert!(wait_until(|| sa_held().iter().any(|m| m.attr_id == 0x0035)));
    let joins: Vec<HeldMad> = sa_held()
        .into_iter()
        .filter(|m| m.attr_id == 0x0038)
        .collect();
    assert!(joins.is_empty(), "MCMemberRecord MADs sent: {joins:?}");
    h.close();
}

#[test]
fn close_with_a_request_waiting_answers_it_once() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    // Duplicate add_address after a netlink resync: tolerated; leftovers freed at close.
    h.add_addr(ep, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
    h.add_addr(ep, ACM_ADDRESS_IP, &[10, 0, 0, 7]);
    h.eps[ep].addrs.pop(); // the core "forgets" this context without remove_address
    let t_ok = h.tid();
    h.resolve(ep, &path_request(t_ok, 40, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    // A request waiting on the SA when the endpoint closes: answered ENODATA, once.
    let t_wait = h.tid();
    h.resolve(ep, &path_request(t_wait, 41, None, 0), 1);
    assert!(wait_until(|| sa_pending() == 1));
    h.close_ep(ep);
    assert!(wait_responses(2, W));
    assert_eq!(find(t_wait)[0].status(), Status::Enodata);
    // The late SA answer is freed and ignored.
    assert!(sa_complete_next(SaAction::Answer));
    h.barrier();
    assert_eq!(find(t_wait).len(), 1);
    assert_eq!(DEAD_ENDPOINT_USE.load(Ordering::SeqCst), 0);
    h.close();
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

#[test]
fn nothing_learned_before_a_port_change_endpoint_reopen_or_reregister_is_served() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t = h.tid();
    h.resolve(ep, &path_request(t, 40, None, 0), 1);
    sa_one(SaAction::Answer, 1);
    // LID change: the core closes everything and reopens; the old path is gone.
    h.close();
    PORT_LID.store(8, Ordering::SeqCst);
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t_new = h.tid();
    h.resolve(ep, &path_request(t_new, 40, None, 0), 1);
    assert!(find(t_new).is_empty(), "no stale hit after a port change");
    sa_one(SaAction::Answer, 1);
    assert_eq!(
        slid_of(&find(t_new)[0].msg),
        8,
        "learned through the new LID"
    );
    // Reopen of an endpoint within the same port open: fresh key space too, at once (the
    // request comes right after the reopen, before the dataplane may have seen the close).
    let t_hit = h.tid();
    h.resolve(ep, &path_request(t_hit, 40, None, 0), 1);
    assert_eq!(find(t_hit).len(), 1, "cached before the reopen");
    h.close_ep(ep);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t_re = h.tid();
    h.resolve(ep, &path_request(t_re, 40, None, 0), 1);
    assert!(find(t_re).is_empty(), "no hit from the closed endpoint");
    sa_one(SaAction::Answer, 3);
    // CLIENT_REREGISTER flushes learned routes, from the moment handle_event returns.
    let t_hit = h.tid();
    h.resolve(ep, &path_request(t_hit, 40, None, 0), 1);
    assert_eq!(find(t_hit).len(), 1, "cached before the reregister");
    h.reregister();
    let t_rr = h.tid();
    h.resolve(ep, &path_request(t_rr, 40, None, 0), 1);
    assert!(find(t_rr).is_empty(), "flushed by reregister");
    sa_one(SaAction::Answer, 5);
    assert!(wait_until(|| log_contains("learned routes flushed")));
    h.close();
    PORT_LID.store(7, Ordering::SeqCst);
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}

#[test]
fn shutdown_answers_requests_in_flight() {
    let _s = serial();
    let mut h = Host::open(OPTS, &[]);
    let ep = h.open_ep(0xffff, (ACM_ADDRESS_NAME, b"node7"));
    let t_sd = h.tid();
    h.resolve(ep, &path_request(t_sd, 42, None, 0), 1);
    let q_sd = h.tid();
    h.query(ep, &path_request(q_sd, 43, None, ACM_FLAGS_QUERY_SA), 2);
    assert!(wait_until(|| sa_pending() == 2));
    // close_device joins the dataplane thread: everything is answered when it returns.
    h.close();
    assert_eq!(find(t_sd).len(), 1);
    assert_eq!(find(t_sd)[0].status(), Status::Enodata);
    assert_eq!(find(q_sd).len(), 1);
    assert!(find(q_sd)[0].query);
    assert_ne!(find(q_sd)[0].status(), Status::Success);
    assert!(log_contains("stopped"));
    // The core hands the MADs back afterwards: freed, no answer.
    sa_drain_timeouts();
    assert_eq!(response_count(), 2);
    assert_eq!(ALLOCS.load(Ordering::SeqCst), FREES.load(Ordering::SeqCst));
}
