//! Answers: the request slots, from a client's request to its polled [`Output::Answer`].
//!
//! A slot is free, waiting (on a route job's or an address entry's waiter FIFO), or answered
//! (on the answer FIFO until [`Resolver::poll_output`](super::Resolver::poll_output) turns it
//! into an [`Answer`]). A waiter needs more than `answer_reserve` free slots, an immediate
//! answer (hit, error, ENOMEM) any free slot: so the refusal of a waiter always has a slot of
//! its own. Answering a slot that is not waiting does nothing: that is the exactly-once rule
//! in one place.

use super::storage::{list_id, List, ReqState, Storage, REQ};
use super::{Answer, Counter, EpId, Kind, MsgBuf, Output, Request, RequestSlot, Via, MSG_LEN};
use crate::wire::client::Status;

/// The request slots, their lists and counts.
pub(crate) struct Answers<S: Storage> {
    /// The request slots.
    pub(crate) reqs: S::Requests,
    /// Free slots.
    pub(crate) free: List,
    /// Answered slots, in answer order, until polled.
    pub(crate) fifo: List,
    /// Slots waiting for an answer.
    pub(crate) waiting: u32,
    /// Slots kept for immediate answers.
    reserve: usize,
}

impl<S: Storage> Answers<S> {
    /// Every slot of `reqs` free.
    pub(crate) fn new(mut reqs: S::Requests, reserve: usize) -> Self {
        reqs.fill(RequestSlot::EMPTY);
        let mut free = List::EMPTY;
        for i in 0..reqs.len() as u32 {
            free.push_back(&mut reqs, i, list_id::FREE, REQ);
        }
        Answers {
            reqs,
            free,
            fifo: List::EMPTY,
            waiting: 0,
            reserve,
        }
    }

    /// A slot holding a copy of `r`, waiting: for a waiter only while more than the reserve
    /// is free, for an immediate answer while any is.
    pub(crate) fn alloc(&mut self, r: &Request<'_>, waiter: bool) -> Option<u32> {
        let reqs = &mut *self.reqs;
        if waiter && (self.free.len as usize) <= self.reserve {
            return None;
        }
        let i = self.free.pop_front(reqs, list_id::FREE, REQ)?;
        let slot = &mut reqs[i as usize];
        let n = r.msg.len().min(MSG_LEN);
        // Only the message's own bytes: nothing reads past `len` (`pop`), and the slot's
        // other cache lines stay untouched (a miss's request is stored on one CPU and
        // answered on another).
        slot.msg[..n].copy_from_slice(&r.msg[..n]);
        slot.len = n as u16;
        slot.client = r.head.client;
        slot.ep = r.head.ep;
        slot.query = r.head.kind == Kind::Query;
        slot.state = ReqState::Waiting;
        slot.has_path = false;
        self.waiting += 1;
        Some(i)
    }

    /// Answers waiting slot `i`; the counter the answer bumps on its endpoint, if any. A slot
    /// not waiting is left alone (`None`).
    pub(crate) fn answer(
        &mut self,
        i: u32,
        status: Status,
        path: Option<&[u8; 64]>,
    ) -> Option<(EpId, Option<Counter>)> {
        let reqs = &mut *self.reqs;
        let r = &mut reqs[i as usize];
        if r.state != ReqState::Waiting {
            return None;
        }
        r.state = ReqState::Answer;
        r.status = status;
        r.has_path = path.is_some();
        if let Some(p) = path {
            r.path = *p;
        }
        let (ep, query) = (r.ep, r.query);
        self.waiting -= 1;
        self.fifo.push_back(reqs, i, list_id::ANSWERS, REQ);
        let counter = match (query, status) {
            (_, Status::Success) => None,
            (false, Status::Enodata) => Some(Counter::NoData),
            _ => Some(Counter::Error),
        };
        Some((ep, counter))
    }

    /// The oldest answer, its message built into `out`, its slot freed.
    pub(crate) fn pop(&mut self, out: &mut MsgBuf) -> Option<Output> {
        let reqs = &mut *self.reqs;
        let i = self.fifo.pop_front(reqs, list_id::ANSWERS, REQ)?;
        let r = &mut reqs[i as usize];
        let via = if r.query { Via::Query } else { Via::Resolve };
        let path = r.has_path.then_some(&r.path);
        let len = super::request::respond(
            &r.msg[..usize::from(r.len)],
            via,
            r.status,
            path,
            &mut out.0,
        );
        let answer = Answer {
            ep: r.ep,
            client: r.client,
            via,
            status: r.status,
            len,
        };
        r.state = ReqState::Free;
        self.free.push_back(reqs, i, list_id::FREE, REQ);
        Some(Output::Answer(answer))
    }
}

#[cfg(feature = "std")]
impl<S: Storage> Answers<S> {
    /// Every slot is on the list its state says, and the counts match.
    pub(crate) fn check(&self) -> Result<(), std::string::String> {
        use std::format;
        let (mut waiting, mut answers, mut free) = (0u32, 0u32, 0u32);
        for r in self.reqs.iter() {
            let want = match r.state {
                ReqState::Waiting => {
                    waiting += 1;
                    list_id::WAITERS
                }
                ReqState::Answer => {
                    answers += 1;
                    list_id::ANSWERS
                }
                ReqState::Free => {
                    free += 1;
                    list_id::FREE
                }
            };
            if r.link.on != want {
                return Err(format!("request in {:?} on list {}", r.state, r.link.on));
            }
        }
        if waiting != self.waiting || answers != self.fifo.len || free != self.free.len {
            return Err(format!(
                "requests: waiting {waiting}/{} answers {answers}/{} free {free}/{}",
                self.waiting, self.fifo.len, self.free.len
            ));
        }
        Ok(())
    }
}
