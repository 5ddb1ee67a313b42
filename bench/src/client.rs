//! The ACM client side of the daemon benches (`miss`, `addr`): a burst of requests sent at
//! once on as many connections and read back as the answers arrive ([`Burst`]), over
//! `acm_fabric::client`'s connections ([`Conn`], re-exported with [`Answer`]).
//!
//! The requests themselves (`ib_acme -f l`, `-f n`) are each bench's own.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

pub use acm_fabric::client::{Answer, Conn, ANSWER_TIMEOUT};

use acm_report::LatencyHistogram;

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
