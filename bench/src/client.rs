//! The ACM client side of the daemon benches (`miss`, `addr`): one TCP connection per request
//! in flight ([`Conn`]), the PATH entry of an answer ([`Answer`]), the core's global counters
//! (`ib_acme -P`), and a burst of requests sent at once on as many connections and read back
//! as the answers arrive ([`Burst`]).
//!
//! The requests themselves (`ib_acme -f l`, `-f n`) are each bench's own.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use acm_core_nostd::wire::client::{
    build_perf_request, AcmMsg, AcmMsgRepr, EpInfoType, PerfResponseRepr, Status, HDR_LEN,
    MAX_COUNTER, MSG_LEN,
};
use acm_core_nostd::wire::path_record::PathRecordRepr;

use crate::LatencyHistogram;

/// How long one answer may take before the run fails (a read on a [`Conn`], a [`Burst`]'s wait
/// for the next answer). Stock retries an unanswered query after `timeout` + subnet timeout;
/// nothing the benches send should be unanswered.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// One TCP connection to a daemon (one request in flight at a time).
pub struct Conn {
    sock: TcpStream,
    buf: [u8; MSG_LEN],
    got: usize,
}

/// What a PATH or RESOLVE answer said.
#[derive(Clone, Copy, Debug)]
pub struct Answer {
    /// The answer's status.
    pub status: Status,
    /// The answer's transaction id.
    pub tid: u64,
    /// The answer's PATH entry ([`PathRecordRepr::ZERO`] on an error status).
    pub path: PathRecordRepr,
}

impl Conn {
    /// Connects to the daemon listening on `127.0.0.1:port` (no Nagle delay, reads time out
    /// after [`ANSWER_TIMEOUT`]).
    pub fn open(port: u16) -> Result<Conn, String> {
        let sock = TcpStream::connect(("127.0.0.1", port)).map_err(io)?;
        sock.set_nodelay(true).map_err(io)?;
        sock.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
        Ok(Conn {
            sock,
            buf: [0; MSG_LEN],
            got: 0,
        })
    }

    /// Sends one request (and forgets any answer read so far).
    pub fn send(&mut self, msg: &[u8]) -> Result<(), String> {
        self.got = 0;
        self.sock.write_all(msg).map_err(io)
    }

    /// Reads what is available; `Some(len)` once a whole message is in the buffer (`be`: the
    /// length is big-endian, as in PERF_QUERY answers).
    pub fn read_some(&mut self, be: bool) -> Result<Option<usize>, String> {
        let n = self.sock.read(&mut self.buf[self.got..]).map_err(io)?;
        if n == 0 {
            return Err("the daemon closed the connection".into());
        }
        self.got += n;
        if self.got < HDR_LEN {
            return Ok(None);
        }
        let m = AcmMsg::new_unchecked(&self.buf[..self.got]);
        let want = if be { m.length_be() } else { m.length() } as usize;
        if !(HDR_LEN..=MSG_LEN).contains(&want) {
            return Err(format!("bad answer length {want}"));
        }
        Ok((self.got >= want).then_some(want))
    }

    /// Reads until a whole message is in the buffer; its length.
    pub fn recv(&mut self, be: bool) -> Result<usize, String> {
        loop {
            if let Some(n) = self.read_some(be)? {
                return Ok(n);
            }
        }
    }

    /// The PATH / RESOLVE answer of `len` bytes in the buffer.
    pub fn answer(&self, len: usize) -> Result<Answer, String> {
        let m = AcmMsg::new_checked(&self.buf[..len]).map_err(|e| format!("{e:?}"))?;
        let (status, tid) = (m.status(), m.tid());
        let mut path = PathRecordRepr::ZERO;
        if status == Status::Success {
            let r = AcmMsgRepr::parse(&m).map_err(|e| format!("answer: {e:?}"))?;
            let i = r
                .entries()
                .iter()
                .position(|e| e.info_type == EpInfoType::Path)
                .ok_or("a success answer without a PATH entry")?;
            path = m.entry(i).ok_or("PATH entry outside the buffer")?.path();
        }
        Ok(Answer { status, tid, path })
    }

    /// One request, waited for: (answer, round-trip time: send → whole answer read).
    pub fn roundtrip(&mut self, msg: &[u8]) -> Result<(Answer, Duration), String> {
        let t0 = Instant::now();
        self.send(msg)?;
        let n = self.recv(false)?;
        let dt = t0.elapsed();
        Ok((self.answer(n)?, dt))
    }

    /// The core's global counters (`ib_acme -P`), in `COUNTER_NAMES` order.
    pub fn counters(&mut self) -> Result<[u64; MAX_COUNTER], String> {
        let mut out = [0u8; HDR_LEN];
        build_perf_request(0, 0x5045_5246, &mut out).map_err(|e| format!("{e:?}"))?;
        self.send(&out)?;
        let n = self.recv(true)?;
        let r = PerfResponseRepr::parse(&AcmMsg::new_unchecked(&self.buf[..n]))
            .map_err(|e| format!("PERF_QUERY answer: {e:?}"))?;
        Ok(r.counters)
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// What [`Burst::next`] saw.
#[derive(Debug)]
pub enum Next {
    /// The answer on connection `i` (to the `i`-th request).
    Answer(usize, Answer),
    /// Every request is answered.
    AllIn,
    /// No answer came for [`ANSWER_TIMEOUT`]; this many are missing.
    TimedOut(usize),
}

/// A burst: request `i` sent on connection `i`, all at once, the answers read as they come,
/// each timed from its own request's send.
pub struct Burst {
    t0: Instant,
    send_span: Duration,
    sent: Vec<Instant>,
    lat: Vec<Duration>,
    pending: Vec<bool>,
    left: usize,
    last: Instant,
    /// Connections `poll` found readable and not read yet.
    ready: Vec<usize>,
    fds: Vec<libc::pollfd>,
}

impl Burst {
    /// Sends `msgs[i]` on `conns[i]`, one after the other without waiting (`conns` has at least
    /// as many connections as there are requests).
    pub fn send(conns: &mut [Conn], msgs: &[&[u8]]) -> Result<Burst, String> {
        let size = msgs.len();
        if size > conns.len() {
            return Err(format!("{size} requests > {} connections", conns.len()));
        }
        let mut sent = vec![Instant::now(); size];
        let t0 = Instant::now();
        for (i, msg) in msgs.iter().enumerate() {
            sent[i] = Instant::now();
            conns[i].send(msg)?;
        }
        let send_span = t0.elapsed();
        Ok(Burst {
            t0,
            send_span,
            sent,
            lat: vec![Duration::ZERO; size],
            pending: vec![true; size],
            left: size,
            last: t0,
            ready: Vec::with_capacity(size),
            fds: Vec::with_capacity(size),
        })
    }

    /// The next answer, in the order they arrive (`conns`: the connections given to
    /// [`send`](Self::send)).
    pub fn next(&mut self, conns: &mut [Conn]) -> Result<Next, String> {
        loop {
            while let Some(i) = self.ready.pop() {
                let Some(n) = conns[i].read_some(false)? else {
                    continue;
                };
                let now = Instant::now();
                self.lat[i] = now - self.sent[i];
                self.last = self.last.max(now);
                self.pending[i] = false;
                self.left -= 1;
                return Ok(Next::Answer(i, conns[i].answer(n)?));
            }
            if self.left == 0 {
                return Ok(Next::AllIn);
            }
            let idx: Vec<usize> = (0..self.pending.len())
                .filter(|&i| self.pending[i])
                .collect();
            self.fds.clear();
            for &i in &idx {
                self.fds.push(libc::pollfd {
                    fd: conns[i].as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs for the call.
            let r = unsafe {
                libc::poll(
                    self.fds.as_mut_ptr(),
                    self.fds.len() as libc::nfds_t,
                    ANSWER_TIMEOUT.as_millis() as i32,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("poll: {e}"));
            }
            if r == 0 {
                return Ok(Next::TimedOut(self.left));
            }
            // Popped from the back: the readable connections in ascending order.
            for (k, &i) in idx.iter().enumerate().rev() {
                if self.fds[k].revents != 0 {
                    self.ready.push(i);
                }
            }
        }
    }

    /// First send → last send (how long the client took to put the burst out).
    pub fn send_span(&self) -> Duration {
        self.send_span
    }

    /// First send → last answer so far.
    pub fn completion(&self) -> Duration {
        self.last - self.t0
    }

    /// Every request's latency (its send → its answer; 0 for one not answered).
    pub fn latencies(&self) -> LatencyHistogram {
        let mut h = LatencyHistogram::new();
        for d in &self.lat {
            h.record(*d);
        }
        h
    }
}
