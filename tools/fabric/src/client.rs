//! A client of a running daemon's socket (`server_mode loop`: TCP on 127.0.0.1): one
//! connection per request in flight ([`Conn`]; the core reads one message per `recv()`), the
//! PATH entry of an answer ([`Answer`]), the core's global counters (`ib_acme -P`). Used by
//! tests that send what `ib_acme` cannot (a ServiceID, a P_Key, a QoS class) and by the
//! daemon benches.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use acm_core_nostd::wire::client::{
    build_perf_request, AcmMsg, AcmMsgRepr, EpInfoType, PerfResponseRepr, Status, HDR_LEN,
    MAX_COUNTER, MSG_LEN,
};
use acm_core_nostd::wire::path_record::PathRecordRepr;

fn io(e: std::io::Error) -> String {
    e.to_string()
}

/// How long one answer may take before the run fails (a read on a [`Conn`], the benches'
/// wait for the next answer of a burst). Stock retries an unanswered query after `timeout` +
/// subnet timeout; nothing the tests and benches send should be unanswered.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

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

/// A RESOLVE request with one PATH entry (`resolve_data[0]`, type `ACM_EP_INFO_PATH`) holding
/// `path`, e.g. an SGID, a DGID and a ServiceID, as a kernel consumer's request reaches the
/// provider through the core; `flags` are the entry's (`FLAGS_QUERY_SA` makes it a `query()`).
pub fn path_request(path: &PathRecordRepr, flags: u32, tid: u64) -> Vec<u8> {
    acm_core_nostd::wire::client::ClientRequest::resolve(tid)
        .path_record(flags, path)
        .bytes()
        .to_vec()
}
