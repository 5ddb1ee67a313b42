//! Provider `resolve()` latency: cache hits and misses, acmrs vs the stock libibacmp.
//!
//! Two parts:
//!
//! * **In-process** (`libacmrs.so` loaded by this program, which plays the ibacm core and an
//!   instant SA): `resolve()` latency on hits and misses with 1k / 100k / 1M cached paths.
//!   The core helpers come from a tiny C shim compiled at run time with `cc` and loaded
//!   `RTLD_GLOBAL` (so no special link flags are needed); its functions forward to Rust.
//!   The stock `libibacmp.so` cannot be driven this way: its `open_device` opens its own verbs
//!   device (ibv_open_device, PD, CQ thread), `open_endpoint` creates a UD QP and joins the
//!   ACM multicast group through the SA, and `resolve()` answers ENODATA until that join
//!   completes — it needs a fabric.
//! * **Through the real ibacm daemon** (`--daemon`): the same daemon binary on the simulated
//!   fabric (acm_fabric), once with libibacmp and once with libacmrs; a TCP client sends PATH
//!   requests (as `ib_acme -f l`) and measures the round trip of cache hits. The ratio of the
//!   two is the provider difference seen by a client (core overhead included in both).
//!
//! `cargo run --release -p acm-bench --bin provider -- [--quick] [--daemon] [--out DIR]`
//! (build `-p acm-plugin` and, for `--daemon`, `-p simverbs` with the same profile first).
//!
//! `--out DIR` gets one `.hgrm` per histogram and a percentile plot (`.svg`, acmrs against
//! stock in one picture; acmrs alone for `--fake-core`) per measurement and size.

use acm_bench::plot::{write_percentile_svg, Series};
use acm_bench::{progress, Args, LatencyHistogram, Table, XorShift};
use acmrs::ffi::*;
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

mod samehost;
use samehost::{dlopen, gid_of, now_ns, sym};

const USAGE: &str = "usage: provider [--quick] [--sizes 1000,100000] [--hit-samples N] \
     [--topology fattree:L,S,H] [--poll-mode busy|adaptive|event] [--sa-direct 0|1] [--sa-inline 0|1] [--out DIR]   (default: same host, same fabric, same run)\n\
       provider --fake-core [--quick] [--sizes ...] [--poll-mode busy|adaptive|event] [--out DIR]\n\
       provider --daemon [--daemon-samples N] [--out DIR]";

// ---- the fake core (Rust side of the shim) -------------------------------------------------

#[repr(C)]
struct Hooks {
    write: extern "C" fn(c_int, *const c_char),
    alloc: extern "C" fn(*const AcmEndpoint, *mut c_void, *mut c_void) -> *mut AcmSaMad,
    send: extern "C" fn(*mut AcmSaMad) -> c_int,
    free: extern "C" fn(*mut AcmSaMad),
    resolve_response: extern "C" fn(u64, *mut AcmMsg) -> c_int,
    query_response: extern "C" fn(u64, *mut AcmMsg) -> c_int,
    opts: extern "C" fn() -> *const c_char,
    inc: extern "C" fn(c_int),
    get_gid: extern "C" fn(*const AcmPort, c_int, *mut [u8; 16]) -> c_int,
    query_port: extern "C" fn(*mut c_void, u8, *mut u8) -> c_int,
}

const SHIM_C: &str = r#"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
struct hooks {
  void (*write)(int, const char *);
  void *(*alloc)(const void *, void *, void *);
  int (*send)(void *);
  void (*free_)(void *);
  int (*resolve_response)(uint64_t, void *);
  int (*query_response)(uint64_t, void *);
  const char *(*opts)(void);
  void (*inc)(int);
  int (*get_gid)(const void *, int, void *);
  int (*query_port)(void *, uint8_t, void *);
};
static struct hooks H;
void acmbench_set_hooks(const struct hooks *h) { H = *h; }
void acm_write(int level, const char *fmt, ...) {
  char b[512]; va_list ap; va_start(ap, fmt); vsnprintf(b, sizeof b, fmt, ap); va_end(ap);
  H.write(level, b);
}
void *acm_alloc_sa_mad(const void *ep, void *ctx, void *handler) { return H.alloc(ep, ctx, handler); }
int acm_send_sa_mad(void *m) { return H.send(m); }
void acm_free_sa_mad(void *m) { H.free_(m); }
int acm_resolve_response(uint64_t id, void *m) { return H.resolve_response(id, m); }
int acm_query_response(uint64_t id, void *m) { return H.query_response(id, m); }
const char *acm_get_opts_file(void) { return H.opts(); }
void acm_increment_counter(int t) { H.inc(t); }
int acm_get_gid(const void *p, int i, void *g) { return H.get_gid(p, i, g); }
int ibv_query_port(void *c, uint8_t p, void *a) { return H.query_port(c, p, a); }
"#;

type Handler = unsafe extern "C" fn(*mut AcmSaMad);

#[repr(C)]
struct CoreSaReq {
    mad: AcmSaMad,
    handler: Handler,
}

static SA_QUEUE: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
static SA_CV: Condvar = Condvar::new();
static SA_STOP: AtomicBool = AtomicBool::new(false);
static ANSWERED: AtomicUsize = AtomicUsize::new(0);
static LAST_ANSWER_NS: AtomicU64 = AtomicU64::new(0);
static OPTS: Mutex<Option<CString>> = Mutex::new(None);

extern "C" fn h_write(_level: c_int, s: *const c_char) {
    if std::env::var_os("ACMRS_BENCH_LOG").is_some() && !s.is_null() {
        // SAFETY: NUL-terminated buffer from the shim.
        eprint!("{}", unsafe { CStr::from_ptr(s) }.to_string_lossy());
    }
}
extern "C" fn h_alloc(
    _ep: *const AcmEndpoint,
    ctx: *mut c_void,
    handler: *mut c_void,
) -> *mut AcmSaMad {
    // SAFETY: zeroed POD plus the handler pointer the provider passed (non-null fn pointer).
    let req = Box::new(CoreSaReq {
        mad: AcmSaMad {
            context: ctx,
            umad: unsafe { std::mem::zeroed() },
            sa_mad: SaPacket { bytes: [0; 256] },
        },
        handler: unsafe { std::mem::transmute::<*mut c_void, Handler>(handler) },
    });
    Box::into_raw(req) as *mut AcmSaMad
}
extern "C" fn h_send(m: *mut AcmSaMad) -> c_int {
    SA_QUEUE.lock().unwrap().push_back(m as usize);
    SA_CV.notify_one();
    0
}
extern "C" fn h_free(m: *mut AcmSaMad) {
    // SAFETY: allocated by h_alloc.
    drop(unsafe { Box::from_raw(m as *mut CoreSaReq) });
}
extern "C" fn h_resolve_response(_id: u64, _m: *mut AcmMsg) -> c_int {
    LAST_ANSWER_NS.store(now_ns(), Ordering::Release);
    ANSWERED.fetch_add(1, Ordering::Release);
    0
}
extern "C" fn h_query_response(_id: u64, _m: *mut AcmMsg) -> c_int {
    0
}
extern "C" fn h_opts() -> *const c_char {
    OPTS.lock()
        .unwrap()
        .as_ref()
        .map_or(std::ptr::null(), |c| c.as_ptr())
}
extern "C" fn h_inc(_t: c_int) {}
extern "C" fn h_get_gid(_p: *const AcmPort, i: c_int, g: *mut [u8; 16]) -> c_int {
    if i != 0 {
        return -1;
    }
    // SAFETY: the provider passes a 16-byte GID buffer.
    unsafe { *g = gid(0x0002_c903_00a1_b2c3) };
    0
}
extern "C" fn h_query_port(_c: *mut c_void, _p: u8, a: *mut u8) -> c_int {
    // SAFETY: the provider passes a zeroed ibv_port_attr-sized buffer; lid at offset 34.
    unsafe { std::ptr::copy_nonoverlapping(7u16.to_ne_bytes().as_ptr(), a.add(34), 2) };
    0
}

/// A GID on the default subnet prefix fe80::/64.
fn gid(guid: u64) -> [u8; 16] {
    gid_of(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0], guid)
}

/// The instant SA: answers every PathRecord GET with a path to the requested DGID.
fn sa_thread() {
    loop {
        let p = {
            let mut q = SA_QUEUE.lock().unwrap();
            loop {
                if let Some(p) = q.pop_front() {
                    break Some(p);
                }
                if SA_STOP.load(Ordering::Acquire) {
                    break None;
                }
                q = SA_CV.wait_timeout(q, Duration::from_millis(50)).unwrap().0;
            }
        };
        let Some(p) = p else { return };
        let req = p as *mut CoreSaReq;
        // SAFETY: a MAD queued by h_send, owned by us until the handler runs.
        unsafe {
            let b = &mut (*req).mad.sa_mad.bytes;
            b[3] = 0x81;
            let mut rec = [0u8; 64];
            rec.copy_from_slice(&b[56..120]);
            let guid = u64::from_be_bytes(rec[16..24].try_into().unwrap());
            let dlid = (guid % 0xbffe + 1) as u16;
            b[96..98].copy_from_slice(&dlid.to_be_bytes());
            b[98..100].copy_from_slice(&7u16.to_be_bytes());
            b[105] = 0x80;
            b[110] = 0x84;
            b[111] = 0x83;
            ((*req).handler)(&mut (*req).mad);
        }
    }
}

fn install_shim(dir: &std::path::Path) {
    let src = dir.join("shim.c");
    let so = dir.join("libacmbenchcore.so");
    std::fs::write(&src, SHIM_C).unwrap();
    let st = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&src)
        .status()
        .expect("cc (build-essential) is needed to build the core shim");
    assert!(st.success(), "shim build failed");
    let h = dlopen(&so, libc::RTLD_NOW | libc::RTLD_GLOBAL).unwrap_or_else(|e| panic!("{e}"));
    let hooks = Hooks {
        write: h_write,
        alloc: h_alloc,
        send: h_send,
        free: h_free,
        resolve_response: h_resolve_response,
        query_response: h_query_response,
        opts: h_opts,
        inc: h_inc,
        get_gid: h_get_gid,
        query_port: h_query_port,
    };
    // SAFETY: the shim's setter copies the struct (layouts match: 10 function pointers).
    unsafe {
        let set = sym(h, c"acmbench_set_hooks").unwrap_or_else(|e| panic!("{e}"));
        let set: extern "C" fn(*const Hooks) = std::mem::transmute(set);
        set(&hooks);
    }
}

fn provider(lib: &std::path::Path) -> &'static AcmProvider {
    samehost::provider(lib).unwrap_or_else(|e| panic!("{e}"))
}

fn path_msg(tid: u64, guid: u64) -> AcmMsg {
    let mut m = AcmMsg::zeroed();
    m.hdr.version = 1;
    m.hdr.opcode = ACM_OP_RESOLVE;
    m.hdr.length = 88;
    m.hdr.tid = tid;
    m.resolve_data[0].type_ = ACM_EP_INFO_PATH;
    m.resolve_data[0].info.bytes[8..24].copy_from_slice(&gid(guid));
    m.resolve_data[0].info.bytes[49] = 1;
    m
}

fn wait_answered(n: usize) {
    let t0 = Instant::now();
    while ANSWERED.load(Ordering::Acquire) < n {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "answers stalled at {}",
            ANSWERED.load(Ordering::Acquire)
        );
        std::hint::spin_loop();
    }
}

struct Results {
    size: usize,
    hit: LatencyHistogram,
    miss_call: LatencyHistogram,
    miss_answer: LatencyHistogram,
}

fn run_size(
    prov: &AcmProvider,
    dir: &std::path::Path,
    size: usize,
    samples: usize,
    poll_mode: &str,
) -> Results {
    let opts = dir.join(format!("opts-{size}.cfg"));
    std::fs::write(
        &opts,
        format!(
            "log_level 0\nsa_depth 32\naddr_prot none\nacmrs_path_capacity {}\nacmrs_request_capacity 65536\n\
             acmrs_pending_capacity 65536\nacmrs_poll_mode {}\n",
            size + size / 4 + 16,
            poll_mode
        ),
    )
    .unwrap();
    *OPTS.lock().unwrap() = Some(CString::new(opts.to_str().unwrap()).unwrap());
    ANSWERED.store(0, Ordering::SeqCst);
    let device = Box::new(AcmDevice {
        verbs: 0x1000 as *mut c_void,
        dev_guid: 1,
    });
    let port = Box::new(AcmPort {
        dev: &*device,
        port_num: 1,
    });
    let ep = Box::new(AcmEndpoint {
        port: &*port,
        pkey: 0xffff,
    });
    let mut name = AcmEpInfo { bytes: [0; 64] };
    name.bytes[..5].copy_from_slice(b"bench");
    let addr = Box::new(AcmAddress {
        endpoint: &*ep,
        info: name,
        id_string: std::ptr::null_mut(),
        type_: ACM_ADDRESS_NAME,
    });
    let (mut dc, mut pc, mut ec, mut ac) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: the provider ABI, called as ibacm does.
    unsafe {
        assert_eq!((prov.open_device)(&*device, &mut dc), 0);
        assert_eq!((prov.open_port)(&*port, dc, &mut pc), 0);
        assert_eq!((prov.open_endpoint)(&*ep, pc, &mut ec), 0);
        assert_eq!((prov.add_address)(&*addr, ec, &mut ac), 0);
    }
    let resolve = |m: &mut AcmMsg| {
        // SAFETY: as ibacm calls it.
        unsafe { (prov.resolve)(ac, m, 1) }
    };
    // Fill the cache with `size` distinct destinations (misses answered by the instant SA).
    let mut sent = 0usize;
    for i in 0..size {
        while sent - ANSWERED.load(Ordering::Acquire) > 30_000 {
            std::hint::spin_loop();
        }
        let mut m = path_msg(i as u64, 0x1_0000 + i as u64);
        resolve(&mut m);
        sent += 1;
    }
    wait_answered(sent);
    // Hits: random cached destinations, each resolve() timed (it answers inline).
    let mut rng = XorShift::new(42);
    let mut hit = LatencyHistogram::new();
    for s in 0..samples {
        let i = rng.below(size as u64);
        let mut m = path_msg(s as u64, 0x1_0000 + i);
        let t0 = Instant::now();
        resolve(&mut m);
        hit.record(t0.elapsed());
    }
    sent += samples;
    wait_answered(sent);
    // Misses, one at a time: the time resolve() holds the core's thread, and the time until
    // the answer (worker → SA → worker → acm_resolve_response).
    let mut miss_call = LatencyHistogram::new();
    let mut miss_answer = LatencyHistogram::new();
    let misses = (samples / 10).max(1000);
    for s in 0..misses {
        let mut m = path_msg(s as u64, 0x4000_0000 + s as u64);
        let t0 = now_ns();
        let c0 = Instant::now();
        resolve(&mut m);
        miss_call.record(c0.elapsed());
        sent += 1;
        wait_answered(sent);
        miss_answer.record(Duration::from_nanos(
            LAST_ANSWER_NS.load(Ordering::Acquire) - t0,
        ));
    }
    // SAFETY: the close sequence of acm_shutdown_port.
    unsafe {
        (prov.remove_address)(ac);
        (prov.close_endpoint)(ec);
        (prov.close_port)(pc);
        (prov.close_device)(dc);
    }
    Results {
        size,
        hit,
        miss_call,
        miss_answer,
    }
}

// ---- through the real daemon ---------------------------------------------------------------

fn daemon_rtt(provider: acm_fabric::Provider, samples: usize) -> Result<LatencyHistogram, String> {
    use acm_fabric::{Fabric, Topology};
    use std::io::{Read, Write};
    let fabric = Fabric::builder(
        Topology::example("net.2sw2path4hca").map_err(|e| e.to_string())?,
        ["Hca3", "Hca4"],
    )
    .provider(provider)
    .name_prefix("bench-provider")
    .option("log_level", "0")
    .start()
    .map_err(|e| e.to_string())?;
    let (n3, n4) = (
        fabric.node("Hca3").map_err(|e| e.to_string())?,
        fabric.node("Hca4").map_err(|e| e.to_string())?,
    );
    let (s, d) = (n3.lid.to_string(), n4.lid.to_string());
    let warm = n3
        .acme_until(
            &["-f", "l", "-s", &s, "-d", &d],
            Duration::from_secs(30),
            |o| o.success(),
        )
        .map_err(|e| e.to_string())?;
    if !warm.success() {
        return Err(format!("warm-up failed: {warm}"));
    }
    let mut sock =
        std::net::TcpStream::connect(("127.0.0.1", n3.server_port)).map_err(|e| e.to_string())?;
    sock.set_nodelay(true).ok();
    let mut h = LatencyHistogram::new();
    let mut buf = [0u8; 592];
    for i in 0..samples {
        let mut m = AcmMsg::zeroed();
        m.hdr.version = 1;
        m.hdr.opcode = ACM_OP_RESOLVE;
        m.hdr.length = 88;
        m.hdr.tid = i as u64;
        m.resolve_data[0].type_ = ACM_EP_INFO_PATH;
        m.resolve_data[0].info.bytes[40..42].copy_from_slice(&n4.lid.to_be_bytes());
        m.resolve_data[0].info.bytes[42..44].copy_from_slice(&n3.lid.to_be_bytes());
        m.resolve_data[0].info.bytes[49] = 1;
        // SAFETY: AcmMsg is plain old data; the first 88 bytes are the request.
        let bytes = unsafe { std::slice::from_raw_parts(&m as *const AcmMsg as *const u8, 88) };
        let t0 = Instant::now();
        sock.write_all(bytes).map_err(|e| e.to_string())?;
        let mut got = 0;
        let mut want = 16;
        while got < want {
            let n = sock.read(&mut buf[got..]).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("daemon closed the connection".into());
            }
            got += n;
            if got >= 8 {
                want = u16::from_ne_bytes([buf[6], buf[7]]) as usize;
            }
        }
        h.record(t0.elapsed());
        if buf[2] != 0 {
            return Err(format!("status {} on request {i}", buf[2]));
        }
    }
    Ok(h)
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some("--samehost-child") {
        if let Err(e) = samehost::child(&raw[1..]) {
            eprintln!("provider (measuring child): {e}");
            std::process::exit(1);
        }
        // The providers' threads are never joined (the core never unloads a provider).
        std::process::exit(0);
    }
    let flag = |f: &str| raw.iter().any(|a| a == f);
    let (daemon, fake_core) = (flag("--daemon"), flag("--fake-core"));
    let rest = raw
        .iter()
        .filter(|a| *a != "--daemon" && *a != "--fake-core")
        .cloned();
    let args = match Args::parse_from(
        rest,
        USAGE,
        &[
            "--sizes",
            "--daemon-samples",
            "--poll-mode",
            "--sa-direct",
            "--sa-inline",
            "--topology",
            "--hit-samples",
        ],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Some(out) = &args.out {
        if let Err(e) = std::fs::create_dir_all(out) {
            eprintln!("cannot create {}: {e}", out.display());
            std::process::exit(1);
        }
    }
    let sizes: Vec<usize> = match args.value("--sizes") {
        Some(s) => match s.split(',').map(|v| v.trim().parse()).collect() {
            Ok(v) => v,
            Err(e) => {
                eprintln!("--sizes {s:?}: {e}\n{USAGE}");
                std::process::exit(2);
            }
        },
        None if args.quick => vec![1000, 100_000],
        None => vec![1000, 100_000, 1_000_000],
    };
    if !fake_core && !daemon {
        // Sizes beyond what the stock provider can preload get the acmrs-only fake-core run.
        let (same, alone): (Vec<usize>, Vec<usize>) = sizes
            .iter()
            .partition(|&&n| n <= samehost::STOCK_MAX_ENTRIES * 11 / 10);
        let cfg = samehost::Config {
            sizes: same,
            hit_samples: match args.value("--hit-samples").map(str::parse) {
                Some(Ok(n)) => n,
                Some(Err(e)) => {
                    eprintln!("--hit-samples: {e}");
                    std::process::exit(2);
                }
                None if args.quick => 20_000,
                None => 200_000,
            },
            topology: args
                .value("--topology")
                .unwrap_or(if args.quick {
                    "fattree:4,2,8"
                } else {
                    "fattree:16,4,16"
                })
                .to_string(),
            out: args.out.clone(),
            poll_mode: args.value("--poll-mode").unwrap_or("adaptive").to_string(),
            sa_direct: args.value("--sa-direct").unwrap_or("0").to_string(),
            sa_inline: args.value("--sa-inline").unwrap_or("0").to_string(),
        };
        if let Err(e) = samehost::run(&cfg) {
            eprintln!("provider: {e}");
            std::process::exit(1);
        }
        if !alone.is_empty() {
            println!(
                "## {alone:?} cached paths: stock n/a\n\n\
                 libibacmp's route preload keeps one LID and one GID entry per unicast DLID \
                 below 0xC000 (at most {} entries here), and a real fabric cannot give 1M \
                 distinct paths to one port (16-bit LIDs), so only acmrs is measured at this \
                 size, in-process with the fake core and an instant SA:\n",
                samehost::STOCK_MAX_ENTRIES
            );
            fake_core_run(&args, &alone);
        }
        return;
    }
    if fake_core {
        fake_core_run(&args, &sizes);
    }
    if daemon {
        let n: usize = args
            .value("--daemon-samples")
            .map_or(20_000, |v| v.parse().expect("--daemon-samples"));
        let mut t = Table::new(&[
            "provider",
            "count",
            "p50 ns",
            "p99 ns",
            "p99.9 ns",
            "p99.99 ns",
            "max ns",
        ]);
        let mut p50 = Vec::new();
        let mut measured = Vec::new();
        for p in [acm_fabric::Provider::Stock, acm_fabric::Provider::Acmrs] {
            let name = p.name().to_string();
            progress(format_args!(
                "daemon mode: {name}: fabric + real ibacm, {n} hits over TCP"
            ));
            match daemon_rtt(p, n) {
                Ok(h) => {
                    measured.push((name.clone(), h.clone()));
                    let s = h.summary();
                    p50.push((s.p50_ns, s.p99_ns));
                    let mut row = vec![name.clone(), s.count.to_string()];
                    row.extend(Table::latency_cells(&s));
                    t.row(row);
                    if let Some(out) = &args.out {
                        h.write_hgrm(&out.join(format!("provider-daemon-{name}-hit.hgrm")))
                            .unwrap();
                    }
                }
                Err(e) => eprintln!("{name}: {e}"),
            }
        }
        if let Some(out) = &args.out {
            // acmrs first (blue), stock second (red).
            measured.reverse();
            let series: Vec<Series<'_>> = measured
                .iter()
                .map(|(name, h)| Series {
                    label: if name == "ibacmp" {
                        "stock libibacmp"
                    } else {
                        name
                    },
                    histogram: h,
                })
                .collect();
            let f = out.join("provider-daemon-hit.svg");
            if let Err(e) = write_percentile_svg(
                &f,
                "real ibacm daemon, cache-hit round trip over TCP",
                &series,
            ) {
                eprintln!("warning: cannot write {}: {e}", f.display());
            }
        }
        println!(
            "\n## real ibacm daemon, cache-hit round trip over TCP (ib_acme -f l equivalent)\n\n{}",
            t.render()
        );
        if let [(a50, a99), (b50, b99)] = p50[..] {
            println!(
                "ratio stock/acmrs: p50 {:.2}x, p99 {:.2}x",
                a50 / b50,
                a99 / b99
            );
        }
    }
}

/// The in-process mode: acmrs alone, with a fake core and an instant SA (up to 1M paths).
fn fake_core_run(args: &Args, sizes: &[usize]) {
    let samples = if args.quick { 100_000 } else { 1_000_000 };
    let poll_mode = args.value("--poll-mode").unwrap_or("adaptive");
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libacmrs.so");
    assert!(
        lib.exists(),
        "{} missing: cargo build --release -p acm-plugin",
        lib.display()
    );
    let dir = std::env::temp_dir().join(format!("acmrs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    install_shim(&dir);
    let prov = provider(&lib);
    std::thread::spawn(sa_thread);
    let mut table = Table::new(&[
        "what",
        "cached paths",
        "count",
        "p50 ns",
        "p99 ns",
        "p99.9 ns",
        "p99.99 ns",
        "max ns",
    ]);
    for &size in sizes {
        progress(format_args!(
            "fake core: {size} cached paths, {samples} samples ({poll_mode})"
        ));
        let r = run_size(prov, &dir, size, samples, poll_mode);
        for (what, h) in [
            ("hit resolve()", &r.hit),
            ("miss resolve() call", &r.miss_call),
            ("miss until answer", &r.miss_answer),
        ] {
            let s = h.summary();
            let mut row = vec![what.to_string(), r.size.to_string(), s.count.to_string()];
            row.extend(Table::latency_cells(&s));
            table.row(row);
            if let Some(out) = &args.out {
                std::fs::create_dir_all(out).unwrap();
                let f = out.join(format!(
                    "provider-acmrs-{}-{}.hgrm",
                    what.replace([' ', '(', ')'], ""),
                    r.size
                ));
                h.write_hgrm(&f).unwrap();
                let svg = f.with_extension("svg");
                let title = format!(
                    "acmrs alone (fake core, instant SA): {what}, {} cached paths",
                    r.size
                );
                let series = [Series {
                    label: "acmrs",
                    histogram: h,
                }];
                if let Err(e) = write_percentile_svg(&svg, &title, &series) {
                    eprintln!("warning: cannot write {}: {e}", svg.display());
                }
            }
        }
    }
    println!(
        "## acmrs in-process (fake core, instant SA)\n\n{}",
        table.render()
    );
    SA_STOP.store(true, Ordering::Release);
    let _ = std::fs::remove_dir_all(&dir);
}
