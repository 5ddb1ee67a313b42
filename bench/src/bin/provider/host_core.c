/*
 * The ibacm core's provider helpers, implemented for real for the same-host benchmark
 * (bench/src/bin/provider/samehost.rs). Compiled at run time with `cc` and loaded
 * RTLD_GLOBAL, so that both libibacmp.so and libacmrs.so, dlopened afterwards in the same
 * process, resolve their `acm_*` imports here, as they would against /usr/sbin/ibacm.
 *
 * Written from the provider contract of rdma-core's acm_prov.h and acm.c (the core helpers and how
 * the core serves them):
 *  - one verbs device, port 1, opened through libibverbs (simverbs under LD_PRELOAD);
 *  - the SA MAD service over libibumad (simverbs under LD_PRELOAD): umad_open_port on the
 *    device, umad_register(SA class 3, version 1, rmpp 1) as the core does, umad_send to the
 *    SM LID/SL, QP1, Q_Key 0x80010000, and a receive thread that matches replies on the low
 *    32 TID bits, copies the reply over the request and calls the provider's handler;
 *  - the GID table snapshot (stops at the first GID with interface id 0), acm_gid_index,
 *    acm_path_comp_mask, acm_get_rate, acm_convert_mtu/rate, acm_format_name, acm_write.
 * Differences from the core, on purpose: no sa_depth credit queue (every MAD is sent at
 * once; the benchmark keeps at most one miss in flight), counters kept but not served.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/acm_prov.h>
#include <infiniband/sa.h>
#include <infiniband/umad.h>
#include <infiniband/verbs.h>

struct hooks {
	void (*write)(int level, const char *text);
	int (*resolve_response)(uint64_t id, struct acm_msg *msg);
	int (*query_response)(uint64_t id, struct acm_msg *msg);
	const char *(*opts)(void);
	/* 0: acm_send_sa_mad entered; 1: a matched SA reply is handed to the provider;
	 * 2: the provider's SA reply handler returned; 3: a bare query's reply arrived */
	void (*stamp)(int what);
};

struct host_info {
	struct ibv_context *verbs;
	uint64_t dev_guid; /* network order, as acm_device.dev_guid */
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t sm_sl;
	uint8_t gid_cnt;
	uint8_t gid0[16];
	char dev_name[64];
	char error[256];
};

struct req {
	struct req *next;
	void (*handler)(struct acm_sa_mad *);
	struct acm_sa_mad mad;
};

#define MAX_GIDS 16
static struct hooks H;
static int g_log_level;
static struct ibv_context *g_verbs;
static union ibv_gid g_gids[MAX_GIDS];
static int g_gid_cnt;
static int g_portid = -1, g_agent = -1;
static uint16_t g_sm_lid, g_pkey_index;
static uint8_t g_sm_sl;
static int g_timeout_ms = 2000, g_retries = 2;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct req *g_pending;
static pthread_t g_thread;
static atomic_int g_stop;
static atomic_ulong g_sent, g_received, g_unmatched, g_counters[ACM_MAX_COUNTER];

void acm_write(int level, const char *fmt, ...)
{
	char b[1024];
	va_list ap;

	if (level > g_log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(b, sizeof b, fmt, ap);
	va_end(ap);
	if (H.write)
		H.write(level, b);
}

int ib_any_gid(union ibv_gid *gid)
{
	static const union ibv_gid zero;
	return !memcmp(gid, &zero, sizeof zero);
}

void acm_format_name(int level, char *name, size_t name_size, uint8_t addr_type,
		     const uint8_t *addr, size_t addr_size)
{
	const struct ibv_path_record *path;

	if (level > g_log_level || !name || !name_size)
		return;
	if (addr_size > ACM_MAX_ADDRESS)
		addr_size = ACM_MAX_ADDRESS;
	switch (addr_type) {
	case ACM_EP_INFO_NAME:
		memcpy(name, addr, addr_size < name_size ? addr_size : name_size);
		name[name_size - 1] = 0;
		break;
	case ACM_EP_INFO_ADDRESS_IP:
		inet_ntop(AF_INET, addr, name, name_size);
		break;
	case ACM_EP_INFO_ADDRESS_IP6:
	case 4: /* GID (internal) */
		inet_ntop(AF_INET6, addr, name, name_size);
		break;
	case ACM_EP_INFO_PATH:
		path = (const struct ibv_path_record *)addr;
		if (path->dlid)
			snprintf(name, name_size, "SLID(%u) DLID(%u)", be16toh(path->slid),
				 be16toh(path->dlid));
		else
			inet_ntop(AF_INET6, path->dgid.raw, name, name_size);
		break;
	case 5: /* LID (internal) */
		snprintf(name, name_size, "LID(%u)", be16toh(*(const uint16_t *)addr));
		break;
	default:
		snprintf(name, name_size, "Unknown");
		break;
	}
}

uint8_t acm_gid_index(struct acm_port *port, union ibv_gid *gid)
{
	int i;

	(void)port;
	for (i = 0; i < g_gid_cnt; i++)
		if (!memcmp(&g_gids[i], gid, sizeof *gid))
			break;
	return (uint8_t)i;
}

int acm_get_gid(struct acm_port *port, int index, union ibv_gid *gid)
{
	(void)port;
	if (index < 0 || index >= g_gid_cnt)
		return -1;
	*gid = g_gids[index];
	return 0;
}

/* PathRecord component mask bits (IBA 15.2.5.16, in the order of the record's fields). */
#define PR_SERVICE_ID (3ULL << 0)
#define PR_DGID (1ULL << 2)
#define PR_SGID (1ULL << 3)
#define PR_DLID (1ULL << 4)
#define PR_SLID (1ULL << 5)
#define PR_FLOW_LABEL (1ULL << 8)
#define PR_HOP_LIMIT (1ULL << 9)
#define PR_TCLASS (1ULL << 10)
#define PR_REVERSIBLE (1ULL << 11)
#define PR_PKEY (1ULL << 13)
#define PR_QOS_CLASS (1ULL << 14)
#define PR_SL (1ULL << 15)
#define PR_MTU_SELECTOR (1ULL << 16)
#define PR_MTU (1ULL << 17)
#define PR_RATE_SELECTOR (1ULL << 18)
#define PR_RATE (1ULL << 19)
#define PR_LIFE_SELECTOR (1ULL << 20)
#define PR_LIFE (1ULL << 21)

__be64 acm_path_comp_mask(struct ibv_path_record *p)
{
	uint64_t m = 0;
	uint32_t fl_hop = be32toh(p->flowlabel_hoplimit);
	uint16_t qos_sl = be16toh(p->qosclass_sl);

	if (p->service_id)
		m |= PR_SERVICE_ID;
	if (!ib_any_gid(&p->dgid))
		m |= PR_DGID;
	if (!ib_any_gid(&p->sgid))
		m |= PR_SGID;
	if (p->dlid)
		m |= PR_DLID;
	if (p->slid)
		m |= PR_SLID;
	if (fl_hop >> 8)
		m |= PR_FLOW_LABEL;
	if (fl_hop & 0xff)
		m |= PR_HOP_LIMIT;
	if (p->tclass)
		m |= PR_TCLASS;
	if (p->reversible_numpath & 0x80)
		m |= PR_REVERSIBLE;
	if (p->pkey)
		m |= PR_PKEY;
	if (qos_sl >> 4)
		m |= PR_QOS_CLASS;
	if (qos_sl & 0xf)
		m |= PR_SL;
	if (p->mtu & 0xc0)
		m |= PR_MTU_SELECTOR;
	if (p->mtu & 0x3f)
		m |= PR_MTU;
	if (p->rate & 0xc0)
		m |= PR_RATE_SELECTOR;
	if (p->rate & 0x3f)
		m |= PR_RATE;
	if (p->packetlifetime & 0xc0)
		m |= PR_LIFE_SELECTOR;
	if (p->packetlifetime & 0x3f)
		m |= PR_LIFE;
	return htobe64(m);
}

enum ibv_rate acm_get_rate(uint8_t width, uint8_t speed)
{
	/* rows: width 1x, 4x, 8x, 12x; columns: SDR, DDR, QDR/FDR10, FDR, EDR */
	static const enum ibv_rate t[4][5] = {
		{ IBV_RATE_2_5_GBPS, IBV_RATE_5_GBPS, IBV_RATE_10_GBPS, IBV_RATE_14_GBPS,
		  IBV_RATE_25_GBPS },
		{ IBV_RATE_10_GBPS, IBV_RATE_20_GBPS, IBV_RATE_40_GBPS, IBV_RATE_56_GBPS,
		  IBV_RATE_100_GBPS },
		{ IBV_RATE_20_GBPS, IBV_RATE_40_GBPS, IBV_RATE_80_GBPS, IBV_RATE_112_GBPS,
		  IBV_RATE_200_GBPS },
		{ IBV_RATE_30_GBPS, IBV_RATE_60_GBPS, IBV_RATE_120_GBPS, IBV_RATE_168_GBPS,
		  IBV_RATE_300_GBPS },
	};
	int w, s;

	switch (width) {
	case 1: w = 0; break;
	case 2: w = 1; break;
	case 4: w = 2; break;
	case 8: w = 3; break;
	default:
		acm_write(0, "acm_get_rate: ERROR - unknown link width 0x%x\n", width);
		return IBV_RATE_MAX;
	}
	switch (speed) {
	case 1: s = 0; break;
	case 2: s = 1; break;
	case 4: case 8: s = 2; break;
	case 16: s = 3; break;
	case 32: s = 4; break;
	default: return IBV_RATE_MAX;
	}
	return t[w][s];
}

enum ibv_mtu acm_convert_mtu(int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return IBV_MTU_2048;
	}
}

enum ibv_rate acm_convert_rate(int rate)
{
	switch (rate) {
	case 2: return IBV_RATE_2_5_GBPS;
	case 5: return IBV_RATE_5_GBPS;
	case 10: return IBV_RATE_10_GBPS;
	case 14: return IBV_RATE_14_GBPS;
	case 20: return IBV_RATE_20_GBPS;
	case 25: return IBV_RATE_25_GBPS;
	case 30: return IBV_RATE_30_GBPS;
	case 40: return IBV_RATE_40_GBPS;
	case 56: return IBV_RATE_56_GBPS;
	case 60: return IBV_RATE_60_GBPS;
	case 80: return IBV_RATE_80_GBPS;
	case 100: return IBV_RATE_100_GBPS;
	case 112: return IBV_RATE_112_GBPS;
	case 120: return IBV_RATE_120_GBPS;
	case 168: return IBV_RATE_168_GBPS;
	case 200: return IBV_RATE_200_GBPS;
	case 300: return IBV_RATE_300_GBPS;
	default: return IBV_RATE_10_GBPS;
	}
}

/* No IPoIB interfaces in the simulation. */
int acm_if_get_sgid(char *ifname, union ibv_gid *sgid)
{
	(void)ifname;
	(void)sgid;
	return -1;
}

const char *acm_get_opts_file(void)
{
	return H.opts ? H.opts() : NULL;
}

void acm_increment_counter(int type)
{
	if (type >= 0 && type < ACM_MAX_COUNTER)
		atomic_fetch_add(&g_counters[type], 1);
}

int acm_resolve_response(uint64_t id, struct acm_msg *msg)
{
	return H.resolve_response(id, msg);
}

int acm_query_response(uint64_t id, struct acm_msg *msg)
{
	return H.query_response(id, msg);
}

struct acm_sa_mad *acm_alloc_sa_mad(const struct acm_endpoint *endpoint, void *context,
				    void (*handler)(struct acm_sa_mad *))
{
	struct req *r;

	if (!endpoint)
		return NULL;
	r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->handler = handler;
	r->mad.context = context;
	return &r->mad;
}

static struct req *req_of(struct acm_sa_mad *mad)
{
	return (struct req *)((char *)mad - offsetof(struct req, mad));
}

void acm_free_sa_mad(struct acm_sa_mad *mad)
{
	if (mad)
		free(req_of(mad));
}

int acm_send_sa_mad(struct acm_sa_mad *mad)
{
	struct req *r = req_of(mad);
	int ret;

	if (H.stamp)
		H.stamp(0);

	mad->umad.addr.qpn = htobe32(1);
	mad->umad.addr.qkey = htobe32(0x80010000);
	mad->umad.addr.lid = htobe16(g_sm_lid);
	mad->umad.addr.sl = g_sm_sl;
	mad->umad.addr.pkey_index = g_pkey_index;
	/* Pending before it is sent (its reply can come back at once), and the lock is not held
	 * across umad_send (a kernel's umad write may block): the receive thread must never wait
	 * for it. */
	pthread_mutex_lock(&g_lock);
	r->next = g_pending;
	g_pending = r;
	pthread_mutex_unlock(&g_lock);
	atomic_fetch_add(&g_sent, 1);
	ret = umad_send(g_portid, g_agent, &mad->umad, sizeof mad->sa_mad, g_timeout_ms,
			g_retries);
	if (ret) {
		struct req **pp;

		pthread_mutex_lock(&g_lock);
		for (pp = &g_pending; *pp; pp = &(*pp)->next) {
			if (*pp == r) {
				*pp = r->next;
				break;
			}
		}
		pthread_mutex_unlock(&g_lock);
		atomic_fetch_sub(&g_sent, 1);
	}
	return ret;
}

static void *recv_thread(void *arg)
{
	struct acm_sa_mad resp;
	struct req **pp, *found;
	int len, ret;

	(void)arg;
	while (!atomic_load(&g_stop)) {
		len = sizeof resp.sa_mad;
		ret = umad_recv(g_portid, &resp.umad, &len, 100);
		if (ret < 0)
			continue; /* timeout (poll) or a transient error */
		atomic_fetch_add(&g_received, 1);
		found = NULL;
		pthread_mutex_lock(&g_lock);
		for (pp = &g_pending; *pp; pp = &(*pp)->next) {
			if ((*pp)->mad.sa_mad.mad_hdr.tid ==
			    (resp.sa_mad.mad_hdr.tid & htobe64(0xFFFFFFFFULL))) {
				found = *pp;
				*pp = found->next;
				break;
			}
		}
		pthread_mutex_unlock(&g_lock);
		if (!found) {
			atomic_fetch_add(&g_unmatched, 1);
			continue;
		}
		if (len < 0 || len > (int)sizeof resp.sa_mad)
			len = sizeof resp.sa_mad;
		memcpy(&found->mad.umad, &resp.umad, sizeof resp.umad + len);
		if (H.stamp)
			H.stamp(1);
		found->handler(&found->mad);
		if (H.stamp)
			H.stamp(2);
	}
	return NULL;
}

/* Opens the first verbs device, port 1, the umad port and agent, and starts the SA thread.
 * 0 on success, else -1 with info->error set. */
int acmbench_host_init(const struct hooks *hooks, int log_level, int timeout_ms, int retries,
		       struct host_info *info)
{
	struct ibv_device **list;
	struct ibv_port_attr attr;
	int n = 0, i;
	uint16_t pkey;

	memset(info, 0, sizeof *info);
	H = *hooks;
	g_log_level = log_level;
	g_timeout_ms = timeout_ms;
	g_retries = retries;
	if (umad_init() < 0) {
		snprintf(info->error, sizeof info->error, "umad_init failed");
		return -1;
	}
	list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		snprintf(info->error, sizeof info->error,
			 "no verbs device (%s): run under LD_PRELOAD=libsimverbs.so",
			 strerror(errno));
		return -1;
	}
	g_verbs = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!g_verbs) {
		snprintf(info->error, sizeof info->error, "ibv_open_device: %s", strerror(errno));
		return -1;
	}
	if (ibv_query_port(g_verbs, 1, &attr)) {
		snprintf(info->error, sizeof info->error, "ibv_query_port failed");
		return -1;
	}
	if (attr.state != IBV_PORT_ACTIVE) {
		snprintf(info->error, sizeof info->error, "port 1 is not active (state %d)",
			 attr.state);
		return -1;
	}
	for (g_gid_cnt = 0; g_gid_cnt < MAX_GIDS; g_gid_cnt++) {
		if (ibv_query_gid(g_verbs, 1, g_gid_cnt, &g_gids[g_gid_cnt]) ||
		    !g_gids[g_gid_cnt].global.interface_id)
			break;
	}
	if (!g_gid_cnt) {
		snprintf(info->error, sizeof info->error, "port 1 has no GID");
		return -1;
	}
	/* The core's sa_pkey_index: the index of 0xFFFF, else of 0x7FFF, else 0. */
	g_pkey_index = 0;
	for (i = 0; i < (int)attr.pkey_tbl_len && i < 128; i++) {
		if (ibv_query_pkey(g_verbs, 1, i, &pkey))
			break;
		if (be16toh(pkey) == 0xffff) {
			g_pkey_index = i;
			break;
		}
		if (be16toh(pkey) == 0x7fff)
			g_pkey_index = i;
	}
	g_sm_lid = attr.sm_lid;
	g_sm_sl = attr.sm_sl;
	g_portid = umad_open_port(g_verbs->device->name, 1);
	if (g_portid < 0) {
		snprintf(info->error, sizeof info->error, "umad_open_port(%s, 1): %d",
			 g_verbs->device->name, g_portid);
		return -1;
	}
	g_agent = umad_register(g_portid, UMAD_CLASS_SUBN_ADM, 1, 1, NULL);
	if (g_agent < 0) {
		snprintf(info->error, sizeof info->error, "umad_register(SA): %d", g_agent);
		return -1;
	}
	if (pthread_create(&g_thread, NULL, recv_thread, NULL)) {
		snprintf(info->error, sizeof info->error, "pthread_create failed");
		return -1;
	}
	info->verbs = g_verbs;
	info->dev_guid = ibv_get_device_guid(g_verbs->device);
	info->lid = attr.lid;
	info->sm_lid = attr.sm_lid;
	info->sm_sl = attr.sm_sl;
	info->gid_cnt = (uint8_t)g_gid_cnt;
	memcpy(info->gid0, g_gids[0].raw, 16);
	snprintf(info->dev_name, sizeof info->dev_name, "%s", g_verbs->device->name);
	return 0;
}

/* MADs sent, received, received without a pending request. */
void acmbench_host_stats(uint64_t out[3])
{
	out[0] = atomic_load(&g_sent);
	out[1] = atomic_load(&g_received);
	out[2] = atomic_load(&g_unmatched);
}

void acmbench_host_stop(void)
{
	atomic_store(&g_stop, 1);
	pthread_join(g_thread, NULL);
}

/* ---- bare transports (the miss bench, samehost misses.rs) ---------------------------- */

/* A PathRecord GET as the providers build it (acmp_init_path_query, acmp_resolve_path_sa):
 * SA class 3 version 2, attribute 0x35, the record from the source GID/LID to dlid (or dgid
 * if non-null), reversible, 1 path, pkey 0xffff, component mask from acm_path_comp_mask.
 * out: the 256 MAD bytes. */
void acmbench_path_mad(uint16_t slid, uint16_t dlid, const uint8_t *dgid, uint64_t tid,
		       uint8_t out[256])
{
	struct ibv_path_record p;
	__be64 mask;
	__be64 btid = htobe64(tid);
	__be16 attr = htobe16(0x35);

	memset(&p, 0, sizeof p);
	memcpy(p.sgid.raw, g_gids[0].raw, 16);
	if (dgid) {
		memcpy(p.dgid.raw, dgid, 16);
	} else {
		p.slid = htobe16(slid);
		p.dlid = htobe16(dlid);
	}
	p.reversible_numpath = 0x81;
	p.pkey = htobe16(0xffff);
	mask = acm_path_comp_mask(&p);
	memset(out, 0, 256);
	out[0] = 1;    /* base version */
	out[1] = 3;    /* SA */
	out[2] = 2;    /* class version */
	out[3] = 1;    /* GET */
	memcpy(out + 8, &btid, 8);
	memcpy(out + 16, &attr, 2);
	memcpy(out + 48, &mask, 8);
	memcpy(out + 56, &p, sizeof p);
}

static atomic_int g_bare_done;
static int g_bare_status;
static uint16_t g_bare_dlid;

static void bare_handler(struct acm_sa_mad *mad)
{
	const uint8_t *rec = (const uint8_t *)&mad->sa_mad + 56;
	uint16_t dlid;

	memcpy(&dlid, rec + 40, 2);
	g_bare_status = mad->umad.status ? -1 : be16toh(mad->sa_mad.mad_hdr.status);
	g_bare_dlid = be16toh(dlid);
	acm_free_sa_mad(mad);
	atomic_store(&g_bare_done, 1);
	if (H.stamp)
		H.stamp(3); /* wakes the waiter */
}

/* One PathRecord GET through this core's SA service (umad, the path the providers' misses
 * take here); stamps 0 (sent) and 1 (reply matched) as for a provider's MAD. Returns 0 once
 * the send went out; then poll acmbench_bare_sa_done. */
int acmbench_bare_sa_send(uint16_t slid, uint16_t dlid, const uint8_t *dgid, uint64_t tid)
{
	static int dummy_ep;
	struct acm_sa_mad *mad;
	int ret;

	mad = acm_alloc_sa_mad((const struct acm_endpoint *)&dummy_ep, NULL, bare_handler);
	if (!mad)
		return -1;
	acmbench_path_mad(slid, dlid, dgid, tid, (uint8_t *)&mad->sa_mad);
	atomic_store(&g_bare_done, 0);
	ret = acm_send_sa_mad(mad);
	if (ret)
		acm_free_sa_mad(mad);
	return ret;
}

/* 1 when the reply of the last acmbench_bare_sa_send arrived (then *status = the MAD status,
 * -1 if umad reported a timeout; *dlid = the record's DLID; the handler freed the MAD), else 0. */
int acmbench_bare_sa_done(int *status, uint16_t *dlid)
{
	if (!atomic_load(&g_bare_done))
		return 0;
	*status = g_bare_status;
	*dlid = g_bare_dlid;
	return 1;
}
