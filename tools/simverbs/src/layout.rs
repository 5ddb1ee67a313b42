//! Layout check of every struct whose Rust definition was written by hand rather than
//! generated from the installed headers: rdma-sys' hand-written unions (`ibv_wc`,
//! `ibv_send_wr`, `ibv_ah_attr`, `ibv_global_route`, `ibv_gid`, `ibv_async_event`) and our
//! `umad_ca_t`/`umad_port_t` mirrors. A C program compiled against the real headers prints
//! `name size` and `name.field offset` lines; the test compares them with Rust's view.

use rdma_sys::*;
use std::mem::{offset_of, size_of};
use umad_ffi::sys::{UmadCa, UmadPort};

const C_SOURCE: &str = r#"
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>
#include <infiniband/umad.h>
#define S(t) printf(#t " %zu\n", sizeof(t))
#define O(t, f) printf(#t "." #f " %zu\n", offsetof(t, f))
int main(void)
{
	S(struct ibv_wc); O(struct ibv_wc, status); O(struct ibv_wc, byte_len);
	O(struct ibv_wc, imm_data); O(struct ibv_wc, qp_num); O(struct ibv_wc, src_qp);
	O(struct ibv_wc, wc_flags); O(struct ibv_wc, pkey_index); O(struct ibv_wc, slid);
	O(struct ibv_wc, sl); O(struct ibv_wc, dlid_path_bits);
	S(struct ibv_send_wr); O(struct ibv_send_wr, sg_list); O(struct ibv_send_wr, num_sge);
	O(struct ibv_send_wr, opcode); O(struct ibv_send_wr, send_flags);
	O(struct ibv_send_wr, imm_data); O(struct ibv_send_wr, wr.ud.ah);
	O(struct ibv_send_wr, wr.ud.remote_qpn); O(struct ibv_send_wr, wr.ud.remote_qkey);
	S(struct ibv_ah_attr); O(struct ibv_ah_attr, dlid); O(struct ibv_ah_attr, sl);
	O(struct ibv_ah_attr, src_path_bits); O(struct ibv_ah_attr, is_global);
	O(struct ibv_ah_attr, port_num);
	S(struct ibv_global_route); O(struct ibv_global_route, flow_label);
	O(struct ibv_global_route, sgid_index); O(struct ibv_global_route, hop_limit);
	O(struct ibv_global_route, traffic_class);
	S(union ibv_gid);
	S(struct ibv_async_event); O(struct ibv_async_event, event_type);
	S(umad_port_t); O(umad_port_t, portnum); O(umad_port_t, capmask);
	O(umad_port_t, gid_prefix); O(umad_port_t, port_guid); O(umad_port_t, pkeys_size);
	O(umad_port_t, pkeys); O(umad_port_t, link_layer);
	S(umad_ca_t); O(umad_ca_t, node_type); O(umad_ca_t, numports); O(umad_ca_t, fw_ver);
	O(umad_ca_t, ca_type); O(umad_ca_t, hw_ver); O(umad_ca_t, node_guid);
	O(umad_ca_t, system_guid); O(umad_ca_t, ports);
	S(struct ib_user_mad); O(struct ib_user_mad, agent_id); O(struct ib_user_mad, status);
	O(struct ib_user_mad, timeout_ms); O(struct ib_user_mad, retries);
	O(struct ib_user_mad, length); O(struct ib_user_mad, addr);
	O(struct ib_user_mad, addr.qpn); O(struct ib_user_mad, addr.qkey);
	O(struct ib_user_mad, addr.lid); O(struct ib_user_mad, addr.sl);
	O(struct ib_user_mad, addr.grh_present); O(struct ib_user_mad, addr.pkey_index);
	S(ib_mad_addr_t);
	return 0;
}
"#;

/// What Rust thinks, in the same `name value` form.
fn rust_view() -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = Vec::new();
    let mut s = |k: &str, n: usize| v.push((k.to_string(), n));
    s("struct ibv_wc", size_of::<ibv_wc>());
    s("struct ibv_wc.status", offset_of!(ibv_wc, status));
    s("struct ibv_wc.byte_len", offset_of!(ibv_wc, byte_len));
    s(
        "struct ibv_wc.imm_data",
        offset_of!(ibv_wc, imm_data_invalidated_rkey_union),
    );
    s("struct ibv_wc.qp_num", offset_of!(ibv_wc, qp_num));
    s("struct ibv_wc.src_qp", offset_of!(ibv_wc, src_qp));
    s("struct ibv_wc.wc_flags", offset_of!(ibv_wc, wc_flags));
    s("struct ibv_wc.pkey_index", offset_of!(ibv_wc, pkey_index));
    s("struct ibv_wc.slid", offset_of!(ibv_wc, slid));
    s("struct ibv_wc.sl", offset_of!(ibv_wc, sl));
    s(
        "struct ibv_wc.dlid_path_bits",
        offset_of!(ibv_wc, dlid_path_bits),
    );
    s("struct ibv_send_wr", size_of::<ibv_send_wr>());
    s(
        "struct ibv_send_wr.sg_list",
        offset_of!(ibv_send_wr, sg_list),
    );
    s(
        "struct ibv_send_wr.num_sge",
        offset_of!(ibv_send_wr, num_sge),
    );
    s("struct ibv_send_wr.opcode", offset_of!(ibv_send_wr, opcode));
    s(
        "struct ibv_send_wr.send_flags",
        offset_of!(ibv_send_wr, send_flags),
    );
    s(
        "struct ibv_send_wr.imm_data",
        offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union),
    );
    let wr = offset_of!(ibv_send_wr, wr);
    s("struct ibv_send_wr.wr.ud.ah", wr + offset_of!(ud_t, ah));
    s(
        "struct ibv_send_wr.wr.ud.remote_qpn",
        wr + offset_of!(ud_t, remote_qpn),
    );
    s(
        "struct ibv_send_wr.wr.ud.remote_qkey",
        wr + offset_of!(ud_t, remote_qkey),
    );
    s("struct ibv_ah_attr", size_of::<ibv_ah_attr>());
    s("struct ibv_ah_attr.dlid", offset_of!(ibv_ah_attr, dlid));
    s("struct ibv_ah_attr.sl", offset_of!(ibv_ah_attr, sl));
    s(
        "struct ibv_ah_attr.src_path_bits",
        offset_of!(ibv_ah_attr, src_path_bits),
    );
    s(
        "struct ibv_ah_attr.is_global",
        offset_of!(ibv_ah_attr, is_global),
    );
    s(
        "struct ibv_ah_attr.port_num",
        offset_of!(ibv_ah_attr, port_num),
    );
    s("struct ibv_global_route", size_of::<ibv_global_route>());
    s(
        "struct ibv_global_route.flow_label",
        offset_of!(ibv_global_route, flow_label),
    );
    s(
        "struct ibv_global_route.sgid_index",
        offset_of!(ibv_global_route, sgid_index),
    );
    s(
        "struct ibv_global_route.hop_limit",
        offset_of!(ibv_global_route, hop_limit),
    );
    s(
        "struct ibv_global_route.traffic_class",
        offset_of!(ibv_global_route, traffic_class),
    );
    s("union ibv_gid", size_of::<ibv_gid>());
    s("struct ibv_async_event", size_of::<ibv_async_event>());
    s(
        "struct ibv_async_event.event_type",
        offset_of!(ibv_async_event, event_type),
    );
    s("umad_port_t", size_of::<UmadPort>());
    s("umad_port_t.portnum", offset_of!(UmadPort, portnum));
    s("umad_port_t.capmask", offset_of!(UmadPort, capmask));
    s("umad_port_t.gid_prefix", offset_of!(UmadPort, gid_prefix));
    s("umad_port_t.port_guid", offset_of!(UmadPort, port_guid));
    s("umad_port_t.pkeys_size", offset_of!(UmadPort, pkeys_size));
    s("umad_port_t.pkeys", offset_of!(UmadPort, pkeys));
    s("umad_port_t.link_layer", offset_of!(UmadPort, link_layer));
    s("umad_ca_t", size_of::<UmadCa>());
    s("umad_ca_t.node_type", offset_of!(UmadCa, node_type));
    s("umad_ca_t.numports", offset_of!(UmadCa, numports));
    s("umad_ca_t.fw_ver", offset_of!(UmadCa, fw_ver));
    s("umad_ca_t.ca_type", offset_of!(UmadCa, ca_type));
    s("umad_ca_t.hw_ver", offset_of!(UmadCa, hw_ver));
    s("umad_ca_t.node_guid", offset_of!(UmadCa, node_guid));
    s("umad_ca_t.system_guid", offset_of!(UmadCa, system_guid));
    s("umad_ca_t.ports", offset_of!(UmadCa, ports));
    use crate::umad::{off, UMAD_SIZE};
    s("struct ib_user_mad", UMAD_SIZE);
    for (f, o) in [
        ("agent_id", off::AGENT_ID),
        ("status", off::STATUS),
        ("timeout_ms", off::TIMEOUT_MS),
        ("retries", off::RETRIES),
        ("length", off::LENGTH),
        ("addr", off::ADDR),
        ("addr.qpn", off::ADDR_QPN),
        ("addr.qkey", off::ADDR_QKEY),
        ("addr.lid", off::ADDR_LID),
        ("addr.sl", off::ADDR_SL),
        ("addr.grh_present", off::ADDR_GRH_PRESENT),
        ("addr.pkey_index", off::ADDR_PKEY_INDEX),
    ] {
        s(&format!("struct ib_user_mad.{f}"), o);
    }
    s("ib_mad_addr_t", off::ADDR_LEN);
    v
}

#[test]
fn hand_written_layouts_match_the_c_headers() {
    let dir = std::env::temp_dir().join(format!("simverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, C_SOURCE).expect("write C source");
    let st = std::process::Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc not found: apt-get install gcc libibverbs-dev libibumad-dev");
    assert!(st.success(), "compiling the layout probe failed");
    let out = std::process::Command::new(&exe)
        .output()
        .expect("run probe");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let c: Vec<(String, usize)> = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect();
    let r = rust_view();
    assert_eq!(c.len(), r.len(), "probe output:\n{text}");
    for (cv, rv) in c.iter().zip(r.iter()) {
        assert_eq!(cv, rv, "C (left) and Rust (right) disagree");
    }
}
