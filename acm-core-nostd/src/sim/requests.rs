//! Client requests on the [`Sim`]: one-line conveniences over the codec's one builder
//! ([`ClientRequest`]), and the caller's inline hit path as the provider has it (a cache hit is
//! answered without the resolver, a NODELAY miss is answered ENODATA and handed over as
//! [`Kind::Prime`], a hit near expiry as [`Kind::Refresh`]), with every answer checked.

use std::format;
use std::vec::Vec;

use super::{Sim, SimAnswer, EP};
use crate::cache::Lookup;
use crate::resolver::front::{self, Front};
use crate::resolver::request;
use crate::resolver::EpId;
use crate::resolver::{Kind, Request, RequestHead, Via};
use crate::wire::client::EpInfoType::Name;
use crate::wire::client::{ClientRequest, PathQuery, Status, FLAGS_NODELAY};
use crate::wire::gid::Gid;

/// A NUL-padded 64-byte name.
pub fn name_bytes(s: &str) -> [u8; 64] {
    let mut a = [0u8; 64];
    let n = s.len().min(64);
    a[..n].copy_from_slice(&s.as_bytes()[..n]);
    a
}

/// A RESOLVE request for a name: the destination entry (NODELAY if `nodelay`), then a source
/// entry if `src` is given (`src_out` set, as the core sets it).
pub fn name_msg(name: &str, src: Option<&str>, nodelay: bool, tid: u64) -> Vec<u8> {
    let r = ClientRequest::resolve(tid).dest(nodelay_flag(nodelay), Name, name.as_bytes());
    match src {
        Some(s) => r.source(Name, s.as_bytes()).bytes().to_vec(),
        None => r.bytes().to_vec(),
    }
}

/// A RESOLVE PATH request by DLID.
pub fn lid_msg(lid: u16, nodelay: bool, tid: u64) -> Vec<u8> {
    ClientRequest::path(tid, nodelay_flag(nodelay), &PathQuery::lid(lid))
        .bytes()
        .to_vec()
}

/// A RESOLVE PATH request by DGID.
pub fn gid_msg(gid: Gid, nodelay: bool, tid: u64) -> Vec<u8> {
    ClientRequest::path(tid, nodelay_flag(nodelay), &PathQuery::gid(gid))
        .bytes()
        .to_vec()
}

/// A `query()` (QUERY_SA) PATH request by DLID.
pub fn query_msg(lid: u16, tid: u64) -> Vec<u8> {
    ClientRequest::query(tid, &PathQuery::lid(lid))
        .bytes()
        .to_vec()
}

fn nodelay_flag(nodelay: bool) -> u32 {
    if nodelay {
        FLAGS_NODELAY
    } else {
        0
    }
}

/// A request asked on the [`Sim`], as its answer must match.
pub(super) struct Asked {
    node: usize,
    ep: EpId,
    tid: u64,
    via: Via,
    /// Answers so far (exactly one is right).
    answers: u32,
}

impl Sim {
    /// A client request on node `i`'s first endpoint ([`request_on`](Self::request_on)).
    pub fn request(&mut self, i: usize, kind: Kind, make: impl FnOnce(u64) -> Vec<u8>) -> u64 {
        self.request_on(i, EP, kind, make)
    }

    /// A client request on node `i`'s endpoint `ep` (`kind` Resolve or Query), through the
    /// caller's hit path as the provider has it. Returns the client id.
    pub fn request_on(
        &mut self,
        i: usize,
        ep: EpId,
        kind: Kind,
        make: impl FnOnce(u64) -> Vec<u8>,
    ) -> u64 {
        let client = self.next_client;
        self.next_client += 1;
        let tid = 0x5000_0000_0000 | client;
        let m = make(tid);
        let via = if kind == Kind::Query {
            Via::Query
        } else {
            Via::Resolve
        };
        let asked = Asked {
            node: i,
            ep,
            tid,
            via,
            answers: 0,
        };
        self.requests.insert(client, asked);
        let now = self.now;
        let node = &mut self.nodes[i];
        let cep = node.cache_ep(ep);
        let open = node.ep(ep).filter(|e| e.open).map(|e| e.cfg);
        let Some(cfg) = open.filter(|_| kind != Kind::Query) else {
            let r = Request::new(ep, cep, client, kind, &m);
            node.node.handle_request(now, &r);
            self.touch(i);
            self.pump();
            return client;
        };
        let view = cfg.view(cep);
        // The provider's hit path: classify, look up, and the one front decision.
        let target = request::classify(&view, &m);
        let lookup = front::look(&*node.cache, &target, now, false);
        // Read after the lookup, as the provider's front reads it.
        let writes = node.cache.writes();
        let (pass, answer) = match front::decide(&target, true, &lookup) {
            Front::Hit { refresh } => {
                let record = match lookup {
                    Lookup::Hit { record, .. } => Some(record),
                    _ => None,
                };
                (
                    refresh.then_some((0, Kind::Refresh)),
                    Some((Status::Success, record)),
                )
            }
            Front::Answer(status) => (None, Some((status, None))),
            Front::Prime => (Some((0, Kind::Prime)), Some((Status::Enodata, None))),
            Front::HandOver => (Some((client, Kind::Resolve)), None),
        };
        if let Some((status, path)) = answer {
            self.record_answer((i, ep), client, tid, Via::Resolve, status, path, true);
        }
        if let Some((client, kind)) = pass {
            let node = &mut self.nodes[i];
            let r = Request {
                head: RequestHead {
                    ep,
                    cache_ep: cep,
                    client,
                    kind,
                    target: Some(target),
                    front_writes: Some(writes),
                },
                msg: &m,
            };
            node.node.handle_request(now, &r);
        }
        self.touch(i);
        self.pump();
        client
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_answer(
        &mut self,
        (node, ep): (usize, EpId),
        client: u64,
        tid: u64,
        via: Via,
        status: Status,
        path: Option<[u8; 64]>,
        inline: bool,
    ) {
        match self.requests.get_mut(&client) {
            Some(r) => {
                r.answers += 1;
                if r.answers > 1 {
                    self.violations
                        .push(format!("client {client}: answered {} times", r.answers));
                }
                if (r.node, r.ep, r.tid, r.via) != (node, ep, tid, via) {
                    self.violations.push(format!(
                        "client {client}: answer on node {node} {ep:?} tid {tid:#x} {via:?}, asked on {} {:?} tid {:#x} {:?}",
                        r.node, r.ep, r.tid, r.via
                    ));
                }
                if self.scale {
                    // Forgotten once answered: a second answer is then "unknown client".
                    self.requests.remove(&client);
                }
            }
            None => self
                .violations
                .push(format!("answer for unknown client {client}")),
        }
        self.answers.push(SimAnswer {
            node,
            ep,
            client,
            status,
            path,
            inline,
            at: self.now,
        });
    }

    /// Takes the answers recorded so far (a long run drains them as it goes).
    pub fn take_answers(&mut self) -> Vec<SimAnswer> {
        core::mem::take(&mut self.answers)
    }

    /// Requests not answered yet.
    pub fn unanswered(&self) -> Vec<u64> {
        self.requests
            .iter()
            .filter(|(_, r)| r.answers == 0)
            .map(|(c, _)| *c)
            .collect()
    }

    /// The answer of `client`, if any.
    pub fn answer_of(&self, client: u64) -> Option<SimAnswer> {
        self.answers.iter().find(|a| a.client == client).copied()
    }
}
