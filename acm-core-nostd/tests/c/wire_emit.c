/* Fills rdma-core wire structs with the installed headers' own helpers and prints each as
 * "name hex". tests/wire_c_headers.rs builds the same messages with acm-core-nostd and
 * compares bytes. */
#include <arpa/inet.h>
#include <endian.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/sa.h>
#include <infiniband/umad_types.h>
#include <infiniband/umad_sa.h>
#include <infiniband/umad_sa_mcm.h>
#include <infiniband/acm.h>

static void hex(const char *name, const void *p, size_t n)
{
	const unsigned char *b = p;
	printf("%s ", name);
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

static void gid(uint8_t *raw, uint64_t prefix, uint64_t iid)
{
	uint64_t p = htobe64(prefix), i = htobe64(iid);
	memcpy(raw, &p, 8);
	memcpy(raw + 8, &i, 8);
}

static void fill_path(struct ibv_path_record *pr)
{
	memset(pr, 0, sizeof(*pr));
	pr->service_id = htobe64(0x1122334455667788ULL);
	gid(pr->dgid.raw, 0xfe80000000000000ULL, 0x10000a);
	gid(pr->sgid.raw, 0xfe80000000000000ULL, 0x100004);
	pr->dlid = htobe16(6);
	pr->slid = htobe16(4);
	pr->flowlabel_hoplimit = htobe32((1U << 31) | (0x12345U << 8) | 0x40);
	pr->tclass = 0x0c;
	pr->reversible_numpath = 0x80 | 1;
	pr->pkey = htobe16(0xffff);
	pr->qosclass_sl = htobe16((0xabc << 4) | 5);
	pr->mtu = umad_sa_set_rate_mtu_or_life(UMAD_SA_SELECTOR_EXACTLY, IBV_MTU_2048);
	pr->rate = umad_sa_set_rate_mtu_or_life(UMAD_SA_SELECTOR_EXACTLY, IBV_RATE_10_GBPS);
	pr->packetlifetime = umad_sa_set_rate_mtu_or_life(UMAD_SA_SELECTOR_EXACTLY, 18);
	pr->preference = 1;
}

/* A zeroed SA MAD with its common header and component mask (host values) set. */
static void sa_start(struct umad_sa_packet *sa, uint8_t method, uint64_t tid, uint16_t attr_id,
		     uint64_t comp_mask)
{
	memset(sa, 0, sizeof(*sa));
	sa->mad_hdr.base_version = UMAD_BASE_VERSION;
	sa->mad_hdr.mgmt_class = UMAD_CLASS_SUBN_ADM;
	sa->mad_hdr.class_version = UMAD_SA_CLASS_VERSION;
	sa->mad_hdr.method = method;
	sa->mad_hdr.tid = htobe64(tid);
	sa->mad_hdr.attr_id = htobe16(attr_id);
	sa->comp_mask = htobe64(comp_mask);
}

int main(void)
{
	struct ibv_path_record pr;
	struct umad_sa_packet sa;
	struct umad_sa_mcmember_record *mc;
	struct acm_msg msg;

	fill_path(&pr);
	hex("path_record", &pr, sizeof(pr));

	/* PathRecord GET, comp mask DGID|SGID|DLID|SLID|SL (bit numbers of IBA). */
	sa_start(&sa, UMAD_METHOD_GET, 0x12345678, UMAD_SA_ATTR_PATH_REC,
		 (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 15));
	fill_path((struct ibv_path_record *) sa.data);
	hex("sa_path_get", &sa, sizeof(sa));

	/* PathRecord GetResp with SA status NO_RECORDS and an RMPP header. */
	sa.mad_hdr.method = UMAD_METHOD_GET_RESP;
	sa.mad_hdr.status = htobe16((UMAD_SA_STATUS_NO_RECORDS << 8) | UMAD_STATUS_INVALID_ATTR_VALUE);
	sa.rmpp_hdr.rmpp_version = UMAD_RMPP_VERSION;
	sa.rmpp_hdr.rmpp_type = 1;
	sa.rmpp_hdr.rmpp_rtime_flags = (5 << 3) | UMAD_RMPP_FLAG_ACTIVE;
	sa.rmpp_hdr.seg_num = htobe32(1);
	sa.rmpp_hdr.paylen_newwin = htobe32(64 + 20);
	sa.attr_offset = htobe16(8);
	memcpy(sa.sm_key, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
	hex("sa_path_resp", &sa, sizeof(sa));

	/* MCMemberRecord SET as ibacm joins (plus non-zero SL/flow/hop and lifetime). */
	sa_start(&sa, UMAD_METHOD_SET, 0x2a, UMAD_SA_ATTR_MCMEMBER_REC,
		 UMAD_SA_MCM_COMP_MASK_MGID | UMAD_SA_MCM_COMP_MASK_PORT_GID |
		 UMAD_SA_MCM_COMP_MASK_QKEY | UMAD_SA_MCM_COMP_MASK_MTU_SEL |
		 UMAD_SA_MCM_COMP_MASK_MTU | UMAD_SA_MCM_COMP_MASK_TCLASS |
		 UMAD_SA_MCM_COMP_MASK_PKEY | UMAD_SA_MCM_COMP_MASK_RATE_SEL |
		 UMAD_SA_MCM_COMP_MASK_RATE | UMAD_SA_MCM_COMP_MASK_SL |
		 UMAD_SA_MCM_COMP_MASK_FLOW_LABEL | UMAD_SA_MCM_COMP_MASK_SCOPE |
		 UMAD_SA_MCM_COMP_MASK_JOIN_STATE);
	mc = (struct umad_sa_mcmember_record *) sa.data;
	memcpy(mc->mgid, "\xff\x15\x40\x01\xff\xff\x00\x03\x04\0\0\0\0\0\0\0", 16);
	gid(mc->portgid, 0xfe80000000000000ULL, 0x100004);
	mc->qkey = htonl(UMAD_QKEY);
	mc->mlid = htons(0xc001);
	mc->mtu = umad_sa_set_rate_mtu_or_life(UMAD_SA_SELECTOR_EXACTLY, IBV_MTU_2048);
	mc->tclass = 0;
	mc->pkey = htons(0xffff);
	mc->rate = umad_sa_set_rate_mtu_or_life(UMAD_SA_SELECTOR_EXACTLY, IBV_RATE_10_GBPS);
	mc->pkt_life = umad_sa_set_rate_mtu_or_life(UMAD_SA_SELECTOR_LESS_THAN, 0x13);
	mc->sl_flow_hop = umad_sa_mcm_set_sl_flow_hop(0xb, 0xabcde, 0x7f);
	mc->scope_state = umad_sa_mcm_set_scope_state(UMAD_SA_MCM_ADDR_SCOPE_SITE_LOCAL, 0);
	umad_sa_mcm_set_join_state(mc, UMAD_SA_MCM_JOIN_STATE_FULL_MEMBER);
	mc->proxy_join = 0x80;
	hex("sa_mcm_set", &sa, sizeof(sa));
	hex("mcmember_record", mc, sizeof(*mc));

	/* A resolve response: PATH entry + echoed IPv4 source, host byte order. */
	memset(&msg, 0, sizeof(msg));
	msg.hdr.version = ACM_VERSION;
	msg.hdr.opcode = ACM_OP_RESOLVE;
	msg.hdr.status = ACM_STATUS_SUCCESS;
	msg.hdr.length = ACM_MSG_HDR_LENGTH + 2 * ACM_MSG_EP_LENGTH;
	msg.hdr.tid = 0x1122334455667788ULL;
	msg.resolve_data[0].flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY |
				    IBV_PATH_FLAG_BIDIRECTIONAL;
	msg.resolve_data[0].type = ACM_EP_INFO_PATH;
	fill_path(&msg.resolve_data[0].info.path);
	msg.resolve_data[1].flags = ACM_EP_FLAG_SOURCE;
	msg.resolve_data[1].type = ACM_EP_INFO_ADDRESS_IP;
	memcpy(msg.resolve_data[1].info.addr, "\x0a\x00\x00\x04", 4);
	hex("acm_resolve_resp", &msg, msg.hdr.length);
	hex("acm_ep_addr_data", &msg.resolve_data[1], sizeof(msg.resolve_data[1]));

	/* A PERF_QUERY response: big-endian length and counters. */
	memset(&msg, 0, sizeof(msg));
	msg.hdr.version = ACM_VERSION;
	msg.hdr.opcode = ACM_OP_PERF_QUERY | ACM_OP_ACK;
	msg.hdr.src_out = 7;
	msg.hdr.src_index = 1;
	msg.hdr.tid = 9;
	msg.hdr.length = htobe16(ACM_MSG_HDR_LENGTH + 7 * 8);
	for (int i = 0; i < 7; i++)
		msg.perf_data[i] = htobe64(1000 + i);
	hex("acm_perf_resp", &msg, ACM_MSG_HDR_LENGTH + 7 * 8);
	return 0;
}
