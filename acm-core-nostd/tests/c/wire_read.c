/* Reads "kind hex" lines from stdin, casts the bytes to the installed rdma-core structs and
 * prints their fields with the headers' own getters, as "key=value" lines.
 * tests/wire_c_headers.rs feeds it acm-core-nostd's emitted bytes. */
#include <arpa/inet.h>
#include <endian.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/sa.h>
#include <infiniband/umad_types.h>
#include <infiniband/umad_sa.h>
#include <infiniband/umad_sa_mcm.h>
#include <infiniband/acm.h>

static unsigned char buf[4096] __attribute__((aligned(8)));

static size_t unhex(const char *s)
{
	size_t n = 0;
	unsigned int v;
	while (s[0] && s[1] && s[0] != '\n' && n < sizeof(buf) && sscanf(s, "%2x", &v) == 1) {
		buf[n++] = (unsigned char) v;
		s += 2;
	}
	return n;
}

static void gidp(const char *k, const uint8_t *g)
{
	printf("%s=", k);
	for (int i = 0; i < 16; i++)
		printf("%02x", g[i]);
	printf("\n");
}

static void path(const struct ibv_path_record *p)
{
	uint32_t fh = be32toh(p->flowlabel_hoplimit);
	uint16_t qs = be16toh(p->qosclass_sl);
	printf("service_id=%llx\n", (unsigned long long) be64toh(p->service_id));
	gidp("dgid", p->dgid.raw);
	gidp("sgid", p->sgid.raw);
	printf("dlid=%u\nslid=%u\n", be16toh(p->dlid), be16toh(p->slid));
	printf("raw_traffic=%u\nflow_label=%x\nhop_limit=%u\n", fh >> 31, (fh >> 8) & 0xfffff,
	       fh & 0xff);
	printf("tclass=%u\nreversible=%u\nnum_path=%u\n", p->tclass, p->reversible_numpath >> 7,
	       p->reversible_numpath & 0x7f);
	printf("pkey=%x\nqos_class=%x\nsl=%u\n", be16toh(p->pkey), qs >> 4, qs & 0xf);
	printf("mtu_sel=%u\nmtu=%u\n", p->mtu >> UMAD_SA_SELECTOR_SHIFT,
	       umad_sa_get_rate_mtu_or_life(p->mtu));
	printf("rate_sel=%u\nrate=%u\n", p->rate >> UMAD_SA_SELECTOR_SHIFT,
	       umad_sa_get_rate_mtu_or_life(p->rate));
	printf("life_sel=%u\nlife=%u\n", p->packetlifetime >> UMAD_SA_SELECTOR_SHIFT,
	       umad_sa_get_rate_mtu_or_life(p->packetlifetime));
	printf("preference=%u\n", p->preference);
}

static void sa_hdr(const struct umad_sa_packet *sa)
{
	printf("base_version=%u\nmgmt_class=%x\nclass_version=%u\nmethod=%x\n",
	       sa->mad_hdr.base_version, sa->mad_hdr.mgmt_class, sa->mad_hdr.class_version,
	       sa->mad_hdr.method);
	printf("status=%x\ntid=%llx\nattr_id=%x\nattr_mod=%x\n", be16toh(sa->mad_hdr.status),
	       (unsigned long long) be64toh(sa->mad_hdr.tid), be16toh(sa->mad_hdr.attr_id),
	       be32toh(sa->mad_hdr.attr_mod));
	printf("comp_mask=%llx\n", (unsigned long long) be64toh(sa->comp_mask));
}

static void mcm(const struct umad_sa_mcmember_record *m)
{
	uint8_t sl, hop, scope, state;
	uint32_t flow;
	umad_sa_mcm_get_sl_flow_hop(m->sl_flow_hop, &sl, &flow, &hop);
	umad_sa_mcm_get_scope_state(m->scope_state, &scope, &state);
	gidp("mgid", m->mgid);
	gidp("port_gid", m->portgid);
	printf("qkey=%x\nmlid=%x\n", ntohl(m->qkey), ntohs(m->mlid));
	printf("mtu_sel=%u\nmtu=%u\ntclass=%u\npkey=%x\n", m->mtu >> 6,
	       umad_sa_get_rate_mtu_or_life(m->mtu), m->tclass, ntohs(m->pkey));
	printf("rate_sel=%u\nrate=%u\nlife_sel=%u\nlife=%u\n", m->rate >> 6,
	       umad_sa_get_rate_mtu_or_life(m->rate), m->pkt_life >> 6,
	       umad_sa_get_rate_mtu_or_life(m->pkt_life));
	printf("sl=%u\nflow_label=%x\nhop_limit=%u\nscope=%u\njoin_state=%u\nproxy_join=%d\n",
	       sl, flow, hop, scope, state,
	       umad_sa_mcm_get_proxy_join((struct umad_sa_mcmember_record *) m));
}

static void msg(const struct acm_msg *m, size_t n)
{
	int cnt = (m->hdr.length - ACM_MSG_HDR_LENGTH) / ACM_MSG_EP_LENGTH;
	printf("version=%u\nopcode=%x\nstatus=%u\nsrc_out=%u\nsrc_index=%u\ndst_index=%u\n",
	       m->hdr.version, m->hdr.opcode, m->hdr.status, m->hdr.src_out, m->hdr.src_index,
	       m->hdr.dst_index);
	printf("length=%u\ntid=%llx\nbytes=%zu\n", m->hdr.length,
	       (unsigned long long) m->hdr.tid, n);
	for (int i = 0; i < cnt && i < 8; i++) {
		const struct acm_ep_addr_data *e = &m->resolve_data[i];
		printf("entry%d.flags=%x\nentry%d.type=%x\n", i, e->flags, i, e->type);
		if (e->type == ACM_EP_INFO_PATH)
			path(&e->info.path);
		else
			printf("entry%d.addr=%u.%u.%u.%u\n", i, e->info.addr[0], e->info.addr[1],
			       e->info.addr[2], e->info.addr[3]);
	}
}

int main(void)
{
	char line[16384], kind[32];
	while (fgets(line, sizeof(line), stdin)) {
		char *sp = strchr(line, ' ');
		if (!sp || (size_t) (sp - line) >= sizeof(kind))
			return 2;
		memcpy(kind, line, sp - line);
		kind[sp - line] = 0;
		size_t n = unhex(sp + 1);
		printf("== %s\n", kind);
		if (!strcmp(kind, "path_record") && n == sizeof(struct ibv_path_record)) {
			path((struct ibv_path_record *) buf);
		} else if (!strcmp(kind, "sa_path") && n == sizeof(struct umad_sa_packet)) {
			sa_hdr((struct umad_sa_packet *) buf);
			path((struct ibv_path_record *) ((struct umad_sa_packet *) buf)->data);
		} else if (!strcmp(kind, "sa_mcm") && n == sizeof(struct umad_sa_packet)) {
			sa_hdr((struct umad_sa_packet *) buf);
			mcm((struct umad_sa_mcmember_record *) ((struct umad_sa_packet *) buf)->data);
		} else if (!strcmp(kind, "acm_msg") && n >= ACM_MSG_HDR_LENGTH) {
			msg((struct acm_msg *) buf, n);
		} else {
			printf("error=bad input %s %zu\n", kind, n);
			return 3;
		}
	}
	return 0;
}
