/* Prints sizeof/offsetof of the installed rdma-core wire structs, one "name value" per line.
 * Used by tests/wire_c_headers.rs to check acm-core-nostd's field offsets. */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/sa.h>
#include <infiniband/umad_types.h>
#include <infiniband/umad_sa.h>
#include <infiniband/umad_sa_mcm.h>
#include <infiniband/acm.h>

#define S(t) printf("sizeof_%s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("%s.%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	S(ibv_path_record);
	O(ibv_path_record, service_id); O(ibv_path_record, dgid); O(ibv_path_record, sgid);
	O(ibv_path_record, dlid); O(ibv_path_record, slid); O(ibv_path_record, flowlabel_hoplimit);
	O(ibv_path_record, tclass); O(ibv_path_record, reversible_numpath); O(ibv_path_record, pkey);
	O(ibv_path_record, qosclass_sl); O(ibv_path_record, mtu); O(ibv_path_record, rate);
	O(ibv_path_record, packetlifetime); O(ibv_path_record, preference);
	O(ibv_path_record, reserved);
	S(umad_hdr);
	O(umad_hdr, base_version); O(umad_hdr, mgmt_class); O(umad_hdr, class_version);
	O(umad_hdr, method); O(umad_hdr, status); O(umad_hdr, class_specific); O(umad_hdr, tid);
	O(umad_hdr, attr_id); O(umad_hdr, resv); O(umad_hdr, attr_mod);
	S(umad_rmpp_hdr);
	O(umad_rmpp_hdr, rmpp_version); O(umad_rmpp_hdr, rmpp_type);
	O(umad_rmpp_hdr, rmpp_rtime_flags); O(umad_rmpp_hdr, rmpp_status);
	O(umad_rmpp_hdr, seg_num); O(umad_rmpp_hdr, paylen_newwin);
	S(umad_sa_packet);
	O(umad_sa_packet, rmpp_hdr); O(umad_sa_packet, sm_key); O(umad_sa_packet, attr_offset);
	O(umad_sa_packet, reserved); O(umad_sa_packet, comp_mask); O(umad_sa_packet, data);
	S(umad_sa_mcmember_record);
	O(umad_sa_mcmember_record, mgid); O(umad_sa_mcmember_record, portgid);
	O(umad_sa_mcmember_record, qkey); O(umad_sa_mcmember_record, mlid);
	O(umad_sa_mcmember_record, mtu); O(umad_sa_mcmember_record, tclass);
	O(umad_sa_mcmember_record, pkey); O(umad_sa_mcmember_record, rate);
	O(umad_sa_mcmember_record, pkt_life); O(umad_sa_mcmember_record, sl_flow_hop);
	O(umad_sa_mcmember_record, scope_state); O(umad_sa_mcmember_record, proxy_join);
	O(umad_sa_mcmember_record, reserved); O(umad_sa_mcmember_record, pad);
	S(acm_hdr);
	O(acm_hdr, version); O(acm_hdr, opcode); O(acm_hdr, status); O(acm_hdr, data);
	O(acm_hdr, length); O(acm_hdr, tid);
	S(acm_ep_addr_data);
	O(acm_ep_addr_data, flags); O(acm_ep_addr_data, type); O(acm_ep_addr_data, reserved);
	O(acm_ep_addr_data, info);
	S(acm_msg);
	O(acm_msg, hdr); O(acm_msg, resolve_data); O(acm_msg, perf_data);
	printf("ACM_MSG_HDR_LENGTH %d\nACM_MSG_EP_LENGTH %d\nACM_MSG_DATA_LENGTH %d\n",
	       ACM_MSG_HDR_LENGTH, ACM_MSG_EP_LENGTH, ACM_MSG_DATA_LENGTH);
	printf("UMAD_LEN_SA_DATA %d\n", UMAD_LEN_SA_DATA);
	return 0;
}
