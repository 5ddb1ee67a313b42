//! The stats exporter: a thread of its own that renders the per-endpoint counters and latency
//! histograms ([`crate::stats`]) as a Prometheus textfile and serves them on a unix socket.
//!
//! * **Textfile** (`acmrs_prom_file`, node_exporter's textfile-collector convention): every
//!   `acmrs_prom_interval_s`, the text goes to a temporary file in the same directory, which
//!   is then renamed over the target (a reader sees the old file or the new one, never half of
//!   one). A failure is logged once with its reason and retried at every interval.
//! * **Socket** (`acmrs_stat_socket`): a client connects, gets one [`Report`] in the
//!   [`encode`]d text form and end-of-file (`acmrs-stat` decodes it). Nothing is read from the
//!   client; a client that does not read is dropped after a 1 s write timeout.
//!
//! Neither ever runs on the dataplane thread or the core's threads: a slow disk or a stuck
//! client delays only this thread. Reading the data is a [`Source`] (the plugin's endpoint
//! registry); snapshots are relaxed loads of the single-writer histograms.

use crate::stats::{Snapshot, BUCKETS};
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Counter names in `ACM_CNTR_*` order, as Prometheus label values.
pub const COUNTERS: [&str; 7] = [
    "error",
    "resolve",
    "no_data",
    "addr_query",
    "addr_cache",
    "route_query",
    "route_cache",
];

/// The histograms of an endpoint: (short name on the socket, Prometheus name, help), in
/// [`EndpointReport::hists`] order.
pub const HISTS: [(&str, &str, &str); 8] = [
    (
        "hit",
        "acmrs_resolve_hit_seconds",
        "Cache hits: resolve() entry to the answer handed to the core (core main thread).",
    ),
    (
        "route_miss",
        "acmrs_route_miss_seconds",
        "PATH/LID/GID requests that missed the cache: resolve() entry to the answer sent by the dataplane.",
    ),
    (
        "addr_miss",
        "acmrs_addr_miss_seconds",
        "NAME/IP/IP6 requests that missed the cache: resolve() entry to the answer sent by the dataplane.",
    ),
    (
        "sa_rtt",
        "acmrs_sa_rtt_seconds",
        "SA round trips: SA MAD handed to the core to its reply taken by the dataplane.",
    ),
    (
        "miss_queued",
        "acmrs_miss_queued_seconds",
        "Misses: the request handed to the dataplane loop to the loop's round taking it.",
    ),
    (
        "miss_to_query",
        "acmrs_miss_to_query_seconds",
        "Misses: the round taking the request to the first query (SA or ACM) sent for it.",
    ),
    (
        "reply_wait",
        "acmrs_sa_reply_wait_seconds",
        "SA replies through the core's SA service: handed to the dataplane loop to the round taking it.",
    ),
    (
        "reply_to_answer",
        "acmrs_reply_to_answer_seconds",
        "Replies (SA, or ACM from a peer): taken by the dataplane loop's round to the first answer it led to.",
    ),
];

/// The Prometheus bucket bounds: (ns, `le` label).
pub const BOUNDS: [(u64, &str); 25] = [
    (100, "1e-07"),
    (250, "2.5e-07"),
    (500, "5e-07"),
    (1_000, "1e-06"),
    (2_500, "2.5e-06"),
    (5_000, "5e-06"),
    (10_000, "1e-05"),
    (25_000, "2.5e-05"),
    (50_000, "5e-05"),
    (100_000, "0.0001"),
    (250_000, "0.00025"),
    (500_000, "0.0005"),
    (1_000_000, "0.001"),
    (2_500_000, "0.0025"),
    (5_000_000, "0.005"),
    (10_000_000, "0.01"),
    (25_000_000, "0.025"),
    (50_000_000, "0.05"),
    (100_000_000, "0.1"),
    (250_000_000, "0.25"),
    (500_000_000, "0.5"),
    (1_000_000_000, "1"),
    (2_500_000_000, "2.5"),
    (5_000_000_000, "5"),
    (10_000_000_000, "10"),
];

/// One endpoint's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointReport {
    /// Port number.
    pub port: u8,
    /// P_Key.
    pub pkey: u16,
    /// The port's GID 0, as text (`fe80::...`).
    pub gid: String,
    /// The 7 `ACM_CNTR_*` counters.
    pub counters: [u64; 7],
    /// Hit, route miss, address miss, SA round trip, then the legs of a miss ([`HISTS`]
    /// order).
    pub hists: [Snapshot; 8],
}

/// The dataplane loop's health ([`crate::plane::Inbox::health`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataplaneHealth {
    /// Resolvers replaced after a caught panic.
    pub restarts: u64,
    /// Times the loop gave up (its recovery panicked too): it answers ENODATA from then on.
    pub gave_up: u64,
    /// The loop's thread runs and resolves (it has neither exited nor given up).
    pub up: bool,
}

/// Everything the exporter shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// The latency clock (`tsc` with its ticks per ns, or `instant`).
    pub clock: String,
    /// The dataplane loop's health.
    pub dataplane: DataplaneHealth,
    /// Open endpoints.
    pub endpoints: Vec<EndpointReport>,
}

/// Where the exporter reads from and logs to (the plugin's instance).
pub trait Source: Send + 'static {
    /// The figures now.
    fn report(&self) -> Report;
    /// Logs a line (0 = errors).
    fn log(&self, level: u8, text: &str);
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn secs(ns: u64) -> String {
    format!("{}", ns as f64 / 1e9)
}

/// The Prometheus text exposition of `r` (`# HELP`/`# TYPE`, labels `port`, `pkey`, `gid`).
pub fn render_prometheus(r: &Report) -> String {
    let mut s = String::new();
    let d = r.dataplane;
    for (name, kind, help, v) in [
        (
            "acmrs_dataplane_up",
            "gauge",
            "1 while the dataplane thread runs and resolves; 0 once it exited or gave up (every miss is then answered ENODATA).",
            u64::from(d.up),
        ),
        (
            "acmrs_dataplane_restarts_total",
            "counter",
            "Resolvers replaced after a caught panic of the dataplane loop.",
            d.restarts,
        ),
        (
            "acmrs_dataplane_gave_up_total",
            "counter",
            "Times the dataplane loop gave up (its recovery from a panic panicked too).",
            d.gave_up,
        ),
    ] {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} {kind}");
        let _ = writeln!(s, "{name} {v}");
    }
    let labels = |e: &EndpointReport| {
        format!(
            "port=\"{}\",pkey=\"0x{:04x}\",gid=\"{}\"",
            e.port,
            e.pkey,
            esc(&e.gid)
        )
    };
    let _ = writeln!(
        s,
        "# HELP acmrs_requests_total The ibacm per-endpoint counters (those of ib_acme -P), by counter."
    );
    let _ = writeln!(s, "# TYPE acmrs_requests_total counter");
    for e in &r.endpoints {
        let l = labels(e);
        for (name, v) in COUNTERS.iter().zip(e.counters) {
            let _ = writeln!(s, "acmrs_requests_total{{{l},counter=\"{name}\"}} {v}");
        }
    }
    for (k, (_, name, help)) in HISTS.iter().enumerate() {
        let _ = writeln!(s, "# HELP {name} {help}");
        let _ = writeln!(s, "# TYPE {name} histogram");
        for e in &r.endpoints {
            let l = labels(e);
            let h = &e.hists[k];
            for (ns, le) in BOUNDS {
                let _ = writeln!(s, "{name}_bucket{{{l},le=\"{le}\"}} {}", h.count_le(ns));
            }
            let n = h.count();
            let _ = writeln!(s, "{name}_bucket{{{l},le=\"+Inf\"}} {n}");
            let _ = writeln!(s, "{name}_sum{{{l}}} {}", secs(h.sum_ns));
            let _ = writeln!(s, "{name}_count{{{l}}} {n}");
        }
    }
    s
}

/// A client of the socket: connects to `socket` and reads the one report the provider writes
/// before it closes (at most 5 s), in the text form [`decode`] reads.
pub fn fetch(socket: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

/// First line of the socket format.
pub const MAGIC: &str = "acmrs-stat 1";

/// The socket's text form of `r`: `acmrs-stat 1`, `clock ...`, `dataplane <restarts>
/// <gave_up> <up 0|1>`, then per endpoint
/// `ep <port> <pkey> <gid>`, `counters <7 numbers>`, one `hist <name> <sum_ns> <i>:<count>...`
/// per histogram (non-empty buckets only), and `end`.
pub fn encode(r: &Report) -> String {
    let mut s = format!("{MAGIC}\nclock {}\n", r.clock);
    let d = r.dataplane;
    let _ = writeln!(
        s,
        "dataplane {} {} {}",
        d.restarts,
        d.gave_up,
        u8::from(d.up)
    );
    for e in &r.endpoints {
        let _ = writeln!(s, "ep {} 0x{:04x} {}", e.port, e.pkey, e.gid);
        s.push_str("counters");
        for c in e.counters {
            let _ = write!(s, " {c}");
        }
        s.push('\n');
        for (k, (short, _, _)) in HISTS.iter().enumerate() {
            let h = &e.hists[k];
            let _ = write!(s, "hist {short} {}", h.sum_ns);
            for (i, c) in h.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                let _ = write!(s, " {i}:{c}");
            }
            s.push('\n');
        }
    }
    s.push_str("end\n");
    s
}

/// Parses [`encode`]'s text; `Err` says what is wrong.
pub fn decode(text: &str) -> Result<Report, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!(
            "not an acmrs stats report (first line is not {MAGIC:?})"
        ));
    }
    let mut r = Report::default();
    let mut complete = false;
    for (n, line) in lines.enumerate() {
        let bad = || format!("line {}: {line:?}", n + 2);
        let mut w = line.split_ascii_whitespace();
        match w.next() {
            Some("clock") => r.clock = w.collect::<Vec<_>>().join(" "),
            Some("dataplane") => {
                let mut n = || w.next().and_then(|v| v.parse::<u64>().ok()).ok_or_else(bad);
                r.dataplane = DataplaneHealth {
                    restarts: n()?,
                    gave_up: n()?,
                    up: match n()? {
                        0 => false,
                        1 => true,
                        _ => return Err(bad()),
                    },
                };
            }
            Some("ep") => {
                // No more endpoints than a provider can have: each costs four histograms.
                if r.endpoints.len() >= acm_core_nostd::resolver::MAX_EPS {
                    return Err(format!(
                        "line {}: more than {} endpoints",
                        n + 2,
                        acm_core_nostd::resolver::MAX_EPS
                    ));
                }
                let port = w.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                let pkey = w
                    .next()
                    .and_then(|v| v.strip_prefix("0x"))
                    .and_then(|v| u16::from_str_radix(v, 16).ok())
                    .ok_or_else(bad)?;
                let gid = w.next().ok_or_else(bad)?.to_string();
                r.endpoints.push(EndpointReport {
                    port,
                    pkey,
                    gid,
                    ..Default::default()
                });
            }
            Some("counters") => {
                let e = r.endpoints.last_mut().ok_or_else(bad)?;
                for c in e.counters.iter_mut() {
                    *c = w.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                }
            }
            Some("hist") => {
                let e = r.endpoints.last_mut().ok_or_else(bad)?;
                let name = w.next().ok_or_else(bad)?;
                let k = HISTS.iter().position(|h| h.0 == name).ok_or_else(bad)?;
                let h = &mut e.hists[k];
                h.sum_ns = w.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
                for b in w {
                    let (i, c) = b.split_once(':').ok_or_else(bad)?;
                    let i: usize = i.parse().map_err(|_| bad())?;
                    if i >= BUCKETS {
                        return Err(bad());
                    }
                    h.counts[i] = c.parse().map_err(|_| bad())?;
                }
            }
            Some("end") => {
                complete = true;
                break;
            }
            _ => return Err(bad()),
        }
    }
    if !complete {
        return Err("report truncated (no `end` line)".into());
    }
    Ok(r)
}

/// The textfile, written atomically; a failure is logged once per failing spell.
#[derive(Debug)]
pub struct Textfile {
    path: PathBuf,
    tmp: PathBuf,
    failing: bool,
}

impl Textfile {
    /// The textfile at `path`; the temporary file is `.<name>.<pid>.tmp` in its directory
    /// (node_exporter reads only `*.prom`).
    pub fn new(path: &Path) -> Self {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        Textfile {
            path: path.to_path_buf(),
            tmp,
            failing: false,
        }
    }

    /// Writes `text` (temporary file, then rename). The first failure of a spell is logged
    /// with its reason; the next success after one is logged too.
    pub fn write(&mut self, text: &str, log: &mut dyn FnMut(u8, &str)) -> bool {
        let r = (|| {
            let mut f = std::fs::File::create(&self.tmp)?;
            f.write_all(text.as_bytes())?;
            drop(f);
            std::fs::rename(&self.tmp, &self.path)
        })();
        match r {
            Ok(()) => {
                if self.failing {
                    log(
                        0,
                        &format!("acmrs_prom_file {} written again", self.path.display()),
                    );
                }
                self.failing = false;
                true
            }
            Err(e) => {
                let _ = std::fs::remove_file(&self.tmp);
                if !self.failing {
                    log(
                        0,
                        &format!(
                            "ERROR - acmrs_prom_file {} cannot be written: {e}; retrying every interval",
                            self.path.display()
                        ),
                    );
                }
                self.failing = true;
                false
            }
        }
    }
}

/// What the exporter does.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// `acmrs_prom_file` (`None`: no textfile).
    pub prom_file: Option<PathBuf>,
    /// `acmrs_prom_interval_s`.
    pub interval: Duration,
    /// `acmrs_stat_socket` (`None`: no socket).
    pub socket: Option<PathBuf>,
}

/// The running exporter thread; [`Exporter::stop`] (or drop) ends it.
pub struct Exporter {
    stop: Option<UnixStream>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Binds the stats socket at `path`: a leftover socket nobody serves is replaced; a live one
/// (another instance) is left alone and reported.
fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match UnixListener::bind(path) {
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    e.kind(),
                    "another process is serving on it",
                ));
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path)
        }
        r => r,
    }
}

fn serve(mut client: UnixStream, src: &dyn Source) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_write_timeout(Some(Duration::from_secs(1)));
    let text = encode(&src.report());
    if let Err(e) = client.write_all(text.as_bytes()) {
        src.log(1, &format!("acmrs_stat_socket: client dropped: {e}"));
    }
}

impl Exporter {
    /// Starts the exporter thread (`acmrs-export`); `None` when there is nothing to do.
    pub fn spawn(cfg: ExportConfig, src: Box<dyn Source>) -> std::io::Result<Option<Exporter>> {
        if cfg.prom_file.is_none() && cfg.socket.is_none() {
            return Ok(None);
        }
        let (stop, stop_rx) = UnixStream::pair()?;
        let thread = std::thread::Builder::new()
            .name("acmrs-export".into())
            .spawn(move || run(cfg, src, stop_rx))?;
        Ok(Some(Exporter {
            stop: Some(stop),
            thread: Some(thread),
        }))
    }

    /// Ends the thread and waits for it (it removes its socket).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // Closing our end makes the thread's end readable (EOF).
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(cfg: ExportConfig, src: Box<dyn Source>, stop: UnixStream) {
    let listener = cfg.socket.as_ref().and_then(|p| match bind(p) {
        Ok(l) => {
            let _ = l.set_nonblocking(true);
            src.log(1, &format!("stats served on {}", p.display()));
            Some(l)
        }
        Err(e) => {
            src.log(
                0,
                &format!(
                    "ERROR - acmrs_stat_socket {}: {e}; not serving stats",
                    p.display()
                ),
            );
            None
        }
    });
    let mut textfile = cfg.prom_file.as_deref().map(Textfile::new);
    let interval = cfg.interval.max(Duration::from_millis(100));
    let mut next = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next {
            if let Some(t) = textfile.as_mut() {
                let text = render_prometheus(&src.report());
                t.write(&text, &mut |l, m| src.log(l, m));
            }
            next = now + interval;
        }
        let wait = next.saturating_duration_since(Instant::now());
        let mut fds = [
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.as_ref().map_or(-1, |l| l.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = wait.as_millis().clamp(1, 60_000) as libc::c_int;
        // SAFETY: `fds` is a valid array of 2 pollfd for the duration of the call; a negative
        // fd is ignored by poll(2).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            break;
        }
        if let Some(l) = listener.as_ref() {
            // A bounded number per wake: a flood of clients cannot starve the textfile.
            for _ in 0..16 {
                let Ok((c, _)) = l.accept() else { break };
                serve(c, &*src);
            }
        }
    }
    if let (Some(p), Some(_)) = (cfg.socket.as_ref(), listener.as_ref()) {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Histogram;
    use std::sync::{Arc, Mutex};

    fn report() -> Report {
        let h = Histogram::new();
        for v in [80, 120, 900, 30_000, 2_000_000] {
            h.record(v);
        }
        let mut e = EndpointReport {
            port: 1,
            pkey: 0xffff,
            gid: "fe80::2:c903:0:3".into(),
            counters: [1, 10, 2, 3, 4, 5, 6],
            ..Default::default()
        };
        e.hists[0] = h.snapshot();
        e.hists[3].counts[100] = 7;
        e.hists[3].sum_ns = 1234;
        Report {
            clock: "tsc 2.3 ticks/ns".into(),
            dataplane: DataplaneHealth {
                restarts: 2,
                gave_up: 1,
                up: false,
            },
            endpoints: vec![e.clone(), EndpointReport { port: 2, ..e }],
        }
    }

    #[test]
    fn a_crafted_report_with_huge_counts_saturates_instead_of_overflowing() {
        let mut s = Snapshot::default();
        s.counts[0] = u64::MAX;
        s.counts[1] = 7;
        s.counts[2] = u64::MAX;
        assert_eq!(s.count(), u64::MAX);
        assert_eq!(s.count_le(u64::MAX), u64::MAX);
    }

    #[test]
    fn encode_decode_round_trip() {
        let r = report();
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        assert!(decode("hello\n").unwrap_err().contains("not an acmrs"));
        let t = encode(&r);
        assert!(decode(&t[..t.len() - 4]).unwrap_err().contains("truncated"));
        assert!(decode(&t.replace("hist sa_rtt", "hist bogus")).is_err());
        assert!(decode(&t.replace("dataplane 2 1 0", "dataplane 2 1 7")).is_err());
    }

    #[test]
    fn prometheus_text_has_cumulative_buckets() {
        let t = render_prometheus(&report());
        assert!(t.contains("# TYPE acmrs_resolve_hit_seconds histogram"));
        let l = "port=\"1\",pkey=\"0xffff\",gid=\"fe80::2:c903:0:3\"";
        for want in [
            format!("acmrs_requests_total{{{l},counter=\"resolve\"}} 10"),
            format!("acmrs_resolve_hit_seconds_bucket{{{l},le=\"1e-07\"}} 1"),
            format!("acmrs_resolve_hit_seconds_bucket{{{l},le=\"2.5e-07\"}} 2"),
            format!("acmrs_resolve_hit_seconds_bucket{{{l},le=\"1e-06\"}} 3"),
            format!("acmrs_resolve_hit_seconds_bucket{{{l},le=\"5e-05\"}} 4"),
            format!("acmrs_resolve_hit_seconds_bucket{{{l},le=\"+Inf\"}} 5"),
            format!("acmrs_resolve_hit_seconds_count{{{l}}} 5"),
            format!("acmrs_resolve_hit_seconds_sum{{{l}}} 0.0020311"),
            format!("acmrs_sa_rtt_seconds_count{{{l}}} 7"),
            "acmrs_dataplane_up 0".to_string(),
            "acmrs_dataplane_restarts_total 2".to_string(),
            "acmrs_dataplane_gave_up_total 1".to_string(),
        ] {
            assert!(t.contains(&want), "{want} not in\n{t}");
        }
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("acmrs-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn textfile_is_replaced_atomically() {
        let d = tmpdir("atomic");
        std::fs::create_dir_all(&d).unwrap();
        let p = d.join("acmrs.prom");
        let mut t = Textfile::new(&p);
        let mut logs = Vec::new();
        assert!(t.write("a 1\n", &mut |_, m| logs.push(m.to_string())));
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
        // A reader holding the old file keeps reading the old content: a rename, not a rewrite.
        let mut old = std::fs::File::open(&p).unwrap();
        assert!(t.write("b 2\n", &mut |_, m| logs.push(m.to_string())));
        let mut s = String::new();
        std::io::Read::read_to_string(&mut old, &mut s).unwrap();
        assert_eq!(s, "a 1\n");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "b 2\n");
        let ino2 = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&p).unwrap());
        assert_ne!(ino, ino2);
        // Only the target is left in the directory.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["acmrs.prom"]);
        assert!(logs.is_empty(), "{logs:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unwritable_path_logged_once_and_retried() {
        let d = tmpdir("unwritable");
        let p = d.join("acmrs.prom");
        let mut t = Textfile::new(&p);
        let mut logs = Vec::new();
        for _ in 0..3 {
            assert!(!t.write("a 1\n", &mut |_, m| logs.push(m.to_string())));
        }
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert!(logs[0].contains("No such file or directory"), "{logs:?}");
        std::fs::create_dir_all(&d).unwrap();
        assert!(t.write("a 1\n", &mut |_, m| logs.push(m.to_string())));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a 1\n");
        assert_eq!(logs.len(), 2);
        assert!(logs[1].contains("written again"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    struct Fake(Arc<Mutex<Vec<String>>>);

    impl Source for Fake {
        fn report(&self) -> Report {
            report()
        }
        fn log(&self, _level: u8, text: &str) {
            self.0.lock().unwrap().push(text.to_string());
        }
    }

    #[test]
    fn exporter_thread_writes_serves_and_stops() {
        let d = tmpdir("thread");
        std::fs::create_dir_all(&d).unwrap();
        let sock = d.join("acmrs.sock");
        let prom = d.join("x.prom");
        // A stale socket file from a dead process is replaced.
        drop(UnixListener::bind(&sock).unwrap());
        let logs = Arc::new(Mutex::new(Vec::new()));
        let ex = Exporter::spawn(
            ExportConfig {
                prom_file: Some(prom.clone()),
                // The textfile is written at once, then hourly: a `stop` that waited for the
                // next round would take an hour, not the 30 s the test allows a loaded box.
                interval: Duration::from_secs(3600),
                socket: Some(sock.clone()),
            },
            Box::new(Fake(logs.clone())),
        )
        .unwrap()
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !prom.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(std::fs::read_to_string(&prom)
            .unwrap()
            .contains("acmrs_requests_total"));
        let mut text = String::new();
        let mut c = UnixStream::connect(&sock).unwrap();
        std::io::Read::read_to_string(&mut c, &mut text).unwrap();
        assert_eq!(decode(&text).unwrap(), report());
        // A second exporter on the same live socket refuses it (and says why).
        let logs2 = Arc::new(Mutex::new(Vec::new()));
        let ex2 = Exporter::spawn(
            ExportConfig {
                prom_file: None,
                interval: Duration::from_secs(10),
                socket: Some(sock.clone()),
            },
            Box::new(Fake(logs2.clone())),
        )
        .unwrap()
        .unwrap();
        while logs2.lock().unwrap().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            logs2.lock().unwrap()[0].contains("another process"),
            "{logs2:?}"
        );
        ex2.stop();
        assert!(
            sock.exists(),
            "the second exporter must not remove the first one's socket"
        );
        let t0 = Instant::now();
        ex.stop();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "stop waited for the next round"
        );
        assert!(!sock.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
