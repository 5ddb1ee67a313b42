//! The endpoint's cache of unicast address handles: what an AH is made from ([`AhKey`]), its
//! slots, and the CLOCK choice of a slot for a destination (a hit, a free one, or a victim no
//! send uses).
#![allow(unsafe_code)]

use super::{SendError, UdEndpoint, VerbsError};
use acm_core_nostd::resolver::{McGroup, UnicastAv};
use rdma_sys::{ibv_ah, ibv_ah_attr, ibv_create_ah, ibv_destroy_ah, ibv_gid, ibv_global_route};

/// What an address handle was made from (everything in `ibv_ah_attr` that varies).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct AhKey {
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    dgid: [u8; 16],
    flow_label: u32,
    hop_limit: u8,
    tclass: u8,
}

impl AhKey {
    pub(super) fn unicast(av: &UnicastAv) -> AhKey {
        AhKey {
            dlid: av.dlid,
            sl: av.sl,
            src_path_bits: av.src_path_bits,
            static_rate: av.static_rate,
            dgid: av.dgid.0,
            flow_label: av.flow_label,
            hop_limit: av.hop_limit,
            tclass: av.tclass,
        }
    }

    pub(super) fn group(g: &McGroup) -> AhKey {
        AhKey {
            dlid: g.mlid,
            sl: g.sl,
            src_path_bits: 0,
            static_rate: g.rate,
            dgid: g.mgid.0,
            flow_label: g.flow_label,
            hop_limit: g.hop_limit,
            tclass: g.tclass,
        }
    }

    pub(super) fn attr(&self, port_num: u8) -> ibv_ah_attr {
        ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: self.dgid },
                flow_label: self.flow_label,
                sgid_index: 0,
                hop_limit: self.hop_limit,
                traffic_class: self.tclass,
            },
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: self.src_path_bits,
            static_rate: self.static_rate,
            is_global: 1,
            port_num,
        }
    }
}

/// A cached unicast address handle.
pub(super) struct AhSlot {
    pub(super) key: AhKey,
    pub(super) ah: *mut ibv_ah,
    pub(super) inflight: u32,
    pub(super) referenced: bool,
}

impl UdEndpoint {
    /// The cache slot of an AH for `av`: a hit, a free slot or a CLOCK victim (not in use).
    pub(super) fn unicast_ah(&mut self, av: &UnicastAv) -> Result<usize, SendError> {
        let key = AhKey::unicast(av);
        if let Some(i) = self
            .ahs
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.key == key))
        {
            if let Some(s) = self.ahs[i].as_mut() {
                s.referenced = true;
            }
            return Ok(i);
        }
        let slot = match self.ahs.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let n = self.ahs.len();
                let mut victim = None;
                for _ in 0..2 * n {
                    let i = self.clock_hand;
                    self.clock_hand = (self.clock_hand + 1) % n;
                    if let Some(s) = self.ahs[i].as_mut() {
                        if s.inflight > 0 {
                            continue;
                        }
                        if s.referenced {
                            s.referenced = false;
                            continue;
                        }
                        victim = Some(i);
                        break;
                    }
                }
                match victim {
                    Some(i) => i,
                    None => {
                        self.stats.ah_busy += 1;
                        return Err(SendError::AhBusy);
                    }
                }
            }
        };
        let mut attr = key.attr(self.cfg.port_num);
        // SAFETY: pd is live; attr is a valid AH attribute.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(SendError::Verbs(VerbsError::from_errno("ibv_create_ah")));
        }
        self.stats.ah_created += 1;
        if let Some(old) = self.ahs[slot].take() {
            // SAFETY: old.ah is a live AH with no send in flight (checked above).
            unsafe { ibv_destroy_ah(old.ah) };
            self.stats.ah_evicted += 1;
        }
        self.ahs[slot] = Some(AhSlot {
            key,
            ah,
            inflight: 0,
            referenced: false,
        });
        Ok(slot)
    }
}
