/*
 * svagent: a small, unmodified libibverbs program driven line by line on stdin, used by the
 * simverbs integration tests (built with `cc svagent.c -libverbs`, run under
 * LD_PRELOAD=libumad2sim.so:libsimverbs.so). One reply line per command on stdout.
 *
 *   init <qkey> <recv_cq_size> [pkey]   open ibsim0, PD, channel, CQs, 1 MiB MR, UD QP to
 *                                   RTS (on the P_Key index of `pkey`, default index 0)
 *                                   -> ok <lid> <qpn> <gid-hex>
 *   recv <n>                        post n receives of 40+2048 bytes         -> ok
 *   recvbad                         post a receive reaching past the MR      -> ok
 *   send <dlid> <dqpn> <qkey> <text> [imm]   signalled send, waits for its completion
 *                                   -> ok status=<n>
 *   sendbad <dlid> <dqpn> <qkey>    send whose SGE reaches past the MR       -> ok status=<n>
 *   flood <dlid> <dqpn> <qkey> <n>  n signalled 64-byte sends, each completed -> ok status=<n>
 *   msend <mlid> <mgid-hex> <qkey> <text>    send to a multicast group (GRH) -> ok status=<n>
 *   madsend <dlid> <dqpn> <qkey> <hex>       send the bytes given in hex (e.g. a 256-byte MAD to
 *                                   QP1 through simverbs' GSI bridge), SL 0 -> ok status=<n>
 *   attach|detach <mgid-hex> <mlid> -> ok | err <errno>
 *   wait <ms>                       next receive completion through the channel
 *                                   -> wc status=.. len=.. src_qp=.. slid=.. grh=.. imm=..
 *                                      sgid=.. dgid=.. data=<text>   | timeout
 *   waitmad <ms>                    like wait, but prints the payload as mad=<hex of byte_len-40
 *                                   bytes> and grh_area=<1 if the 40-byte GRH area still holds
 *                                   the 0x5a fill `recv` put there, else 0>
 *   qkey <qkey>                     ibv_modify_qp(IBV_QP_QKEY) in RTS      -> ok | err <rc>
 *   async <ms>                      next async event -> async <type> <port|cq> | timeout
 *   port                            ibv_query_port now -> ok <lid> <sm_lid> <state>
 *   quit
 */
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#define BUF_SIZE (1 << 20)
#define SLOT (40 + 2048)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *ch;
static struct ibv_cq *scq, *rcq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char *buf;
static int next_slot;
static uint16_t lid;

static void hex(const uint8_t *p, int n, char *out)
{
	for (int i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
}

static int unhex(const char *s, uint8_t *out, int n)
{
	if ((int)strlen(s) != 2 * n)
		return -1;
	for (int i = 0; i < n; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = v;
	}
	return 0;
}

static int do_init(uint32_t qkey, int rcq_size, const char *pkey)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1) {
		printf("err no device\n");
		return -1;
	}
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!ctx) {
		printf("err open %d\n", errno);
		return -1;
	}
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa)) {
		printf("err query_port\n");
		return -1;
	}
	lid = pa.lid;
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid)) {
		printf("err query_gid\n");
		return -1;
	}
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, rcq_size, (void *)0x1234, ch, 0);
	buf = calloc(1, BUF_SIZE);
	mr = ibv_reg_mr(pd, buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
	if (!pd || !ch || !scq || !rcq || !buf || !mr) {
		printf("err alloc %d\n", errno);
		return -1;
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 64, .max_recv_wr = 256, .max_send_sge = 2, .max_recv_sge = 2 },
	};
	qp = ibv_create_qp(pd, &ia);
	if (!qp) {
		printf("err create_qp %d\n", errno);
		return -1;
	}
	int pkey_index = 0;
	if (*pkey) {
		pkey_index = ibv_get_pkey_index(ctx, 1, htons(strtoul(pkey, NULL, 0)));
		if (pkey_index < 0) {
			printf("err pkey %s not in the table\n", pkey);
			return -1;
		}
	}
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = pkey_index, .port_num = 1,
				 .qkey = qkey };
	/* RTR straight from RESET must be refused (state machine check). */
	struct ibv_qp_attr bad = { .qp_state = IBV_QPS_RTR };
	if (ibv_modify_qp(qp, &bad, IBV_QP_STATE) == 0) {
		printf("err RESET->RTR accepted\n");
		return -1;
	}
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)) {
		printf("err INIT\n");
		return -1;
	}
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) {
		printf("err RTR\n");
		return -1;
	}
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0) {
		printf("err RTS without SQ_PSN accepted\n");
		return -1;
	}
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)) {
		printf("err RTS\n");
		return -1;
	}
	if (qp->state != IBV_QPS_RTS) {
		printf("err qp->state %d\n", qp->state);
		return -1;
	}
	char g[33];
	hex(gid.raw, 16, g);
	printf("ok %u %u %s\n", lid, qp->qp_num, g);
	return 0;
}

static int post_recv(char *addr, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uintptr_t)addr, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(qp, &wr, &bad);
}

static int send_to(struct ibv_ah_attr *aa, uint32_t dqpn, uint32_t qkey, char *data, uint32_t len,
		   int with_imm, uint32_t imm)
{
	struct ibv_ah *ah = ibv_create_ah(pd, aa);
	if (!ah)
		return -errno;
	struct ibv_sge sge = { .addr = (uintptr_t)data, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 77, .sg_list = &sge, .num_sge = 1,
		.opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.imm_data = htonl(imm);
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = dqpn;
	wr.wr.ud.remote_qkey = qkey;
	int rc = ibv_post_send(qp, &wr, &bad);
	if (rc) {
		ibv_destroy_ah(ah);
		return -rc;
	}
	struct ibv_wc wc;
	int n;
	for (int i = 0; i < 100000; i++) {
		n = ibv_poll_cq(scq, 1, &wc);
		if (n)
			break;
	}
	ibv_destroy_ah(ah);
	if (n != 1)
		return -ETIMEDOUT;
	return wc.status;
}

static void print_wc_mad(struct ibv_wc *wc)
{
	uint8_t *slot = (uint8_t *)(uintptr_t)wc->wr_id;
	int untouched = 1;
	for (int i = 0; i < 40; i++)
		untouched &= slot[i] == 0x5a;
	int dlen = wc->status == IBV_WC_SUCCESS && wc->byte_len >= 40 ? (int)wc->byte_len - 40 : 0;
	static char h[2 * 2048 + 1];
	if (dlen > 2048)
		dlen = 2048;
	hex(slot + 40, dlen, h);
	h[2 * dlen] = 0;
	printf("wc status=%d len=%u qp=%u src_qp=%u slid=%u sl=%u pkey_index=%u path_bits=%u grh=%d "
	       "grh_area=%d mad=%s\n",
	       wc->status, wc->byte_len, wc->qp_num, wc->src_qp, wc->slid, wc->sl, wc->pkey_index,
	       wc->dlid_path_bits, !!(wc->wc_flags & IBV_WC_GRH), untouched, h);
}

static void print_wc(struct ibv_wc *wc)
{
	char *slot = (char *)(uintptr_t)wc->wr_id;
	char sg[33] = "-", dg[33] = "-";
	if (wc->wc_flags & IBV_WC_GRH) {
		hex((uint8_t *)slot + 8, 16, sg);
		hex((uint8_t *)slot + 24, 16, dg);
	}
	int dlen = wc->status == IBV_WC_SUCCESS && wc->byte_len >= 40 ? (int)wc->byte_len - 40 : 0;
	printf("wc status=%d len=%u qp=%u src_qp=%u slid=%u sl=%u pkey_index=%u path_bits=%u grh=%d "
	       "imm=%s%u sgid=%s dgid=%s data=%.*s\n",
	       wc->status, wc->byte_len, wc->qp_num, wc->src_qp, wc->slid, wc->sl, wc->pkey_index,
	       wc->dlid_path_bits, !!(wc->wc_flags & IBV_WC_GRH),
	       (wc->wc_flags & IBV_WC_WITH_IMM) ? "" : "none:",
	       (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0, sg, dg, dlen, slot + 40);
}

static void do_wait(int ms, void (*print)(struct ibv_wc *))
{
	struct ibv_wc wc;
	/* Garbage first: every field printed must have been written by poll_cq. */
	memset(&wc, 0xa5, sizeof(wc));
	for (;;) {
		if (ibv_poll_cq(rcq, 1, &wc) == 1) {
			print(&wc);
			return;
		}
		if (ibv_req_notify_cq(rcq, 0)) {
			printf("err notify\n");
			return;
		}
		/* A completion may have landed between the poll and the arm. */
		if (ibv_poll_cq(rcq, 1, &wc) == 1) {
			print(&wc);
			return;
		}
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		if (poll(&p, 1, ms) <= 0) {
			printf("timeout\n");
			return;
		}
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != rcq || ev_ctx != (void *)0x1234) {
			printf("err get_cq_event\n");
			return;
		}
		ibv_ack_cq_events(ev_cq, 1);
	}
}

static void do_async(int ms)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	if (poll(&p, 1, ms) <= 0) {
		printf("timeout\n");
		return;
	}
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev)) {
		printf("err get_async_event %d\n", errno);
		return;
	}
	if (ev.event_type == IBV_EVENT_CQ_ERR)
		printf("async %s %s\n", ibv_event_type_str(ev.event_type),
		       ev.element.cq == rcq ? "rcq" : "other-cq");
	else
		printf("async %s %d\n", ibv_event_type_str(ev.event_type), ev.element.port_num);
	ibv_ack_async_event(&ev);
}

int main(void)
{
	char line[4096];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof line, stdin)) {
		char cmd[32] = "", a1[128] = "", a2[128] = "", a3[128] = "", a4[2048] = "", a5[64] = "";
		int n = sscanf(line, "%31s %127s %127s %127s %2047s %63s", cmd, a1, a2, a3, a4, a5);
		if (n < 1)
			continue;
		if (!strcmp(cmd, "quit"))
			break;
		if (!strcmp(cmd, "init")) {
			if (do_init(strtoul(a1, NULL, 0), atoi(a2), a3))
				return 1;
		} else if (!strcmp(cmd, "recv")) {
			int k = atoi(a1), rc = 0;
			for (int i = 0; i < k && !rc; i++) {
				memset(buf + (size_t)next_slot * SLOT, 0x5a, 40);
				rc = post_recv(buf + (size_t)next_slot * SLOT, SLOT);
				next_slot = (next_slot + 1) % (BUF_SIZE / SLOT - 1);
			}
			printf(rc ? "err %d\n" : "ok\n", rc);
		} else if (!strcmp(cmd, "recvbad")) {
			int rc = post_recv(buf + BUF_SIZE - 100, SLOT);
			printf(rc ? "err %d\n" : "ok\n", rc);
		} else if (!strcmp(cmd, "send") || !strcmp(cmd, "sendbad")) {
			struct ibv_ah_attr aa = { .dlid = strtoul(a1, NULL, 0), .port_num = 1, .sl = 2 };
			char *data = buf + BUF_SIZE - 4096;
			uint32_t len;
			if (!strcmp(cmd, "send")) {
				len = strlen(a4);
				memcpy(data, a4, len);
			} else {
				data = buf + BUF_SIZE - 10;
				len = 100;
			}
			int st = send_to(&aa, strtoul(a2, NULL, 0), strtoul(a3, NULL, 0), data, len,
					 n >= 6, strtoul(a5, NULL, 0));
			printf("ok status=%d\n", st);
		} else if (!strcmp(cmd, "flood")) {
			struct ibv_ah_attr aa = { .dlid = strtoul(a1, NULL, 0), .port_num = 1 };
			int k = atoi(a4), st = 0;
			for (int i = 0; i < k && st == 0; i++)
				st = send_to(&aa, strtoul(a2, NULL, 0), strtoul(a3, NULL, 0),
					     buf + BUF_SIZE - 4096, 64, 0, 0);
			printf("ok status=%d\n", st);
		} else if (!strcmp(cmd, "msend")) {
			struct ibv_ah_attr aa = { .dlid = strtoul(a1, NULL, 0), .port_num = 1,
						  .is_global = 1 };
			aa.grh.hop_limit = 1;
			if (unhex(a2, aa.grh.dgid.raw, 16)) {
				printf("err mgid\n");
				continue;
			}
			char *data = buf + BUF_SIZE - 4096;
			uint32_t len = strlen(a4);
			memcpy(data, a4, len);
			int st = send_to(&aa, 0xffffff, strtoul(a3, NULL, 0), data, len, 0, 0);
			printf("ok status=%d\n", st);
		} else if (!strcmp(cmd, "attach") || !strcmp(cmd, "detach")) {
			union ibv_gid g;
			if (unhex(a1, g.raw, 16)) {
				printf("err mgid\n");
				continue;
			}
			int rc = !strcmp(cmd, "attach") ? ibv_attach_mcast(qp, &g, strtoul(a2, NULL, 0))
							: ibv_detach_mcast(qp, &g, strtoul(a2, NULL, 0));
			printf(rc ? "err %d\n" : "ok\n", rc);
		} else if (!strcmp(cmd, "wait")) {
			do_wait(atoi(a1), print_wc);
		} else if (!strcmp(cmd, "qkey")) {
			struct ibv_qp_attr qa = { .qkey = strtoul(a1, NULL, 0) };
			int rc = ibv_modify_qp(qp, &qa, IBV_QP_QKEY);
			printf(rc ? "err %d\n" : "ok\n", rc);
		} else if (!strcmp(cmd, "waitmad")) {
			do_wait(atoi(a1), print_wc_mad);
		} else if (!strcmp(cmd, "madsend")) {
			struct ibv_ah_attr aa = { .dlid = strtoul(a1, NULL, 0), .port_num = 1 };
			char *data = buf + BUF_SIZE - 4096;
			int len = strlen(a4) / 2;
			if (len > 2048 || unhex(a4, (uint8_t *)data, len)) {
				printf("err hex\n");
				continue;
			}
			int st = send_to(&aa, strtoul(a2, NULL, 0), strtoul(a3, NULL, 0), data, len, 0, 0);
			printf("ok status=%d\n", st);
		} else if (!strcmp(cmd, "port")) {
			struct ibv_port_attr pa;
			if (ibv_query_port(ctx, 1, &pa))
				printf("err query_port\n");
			else
				printf("ok %u %u %d\n", pa.lid, pa.sm_lid, pa.state);
		} else if (!strcmp(cmd, "async")) {
			do_async(atoi(a1));
		} else {
			printf("err unknown command\n");
		}
	}
	if (qp && ibv_destroy_qp(qp))
		return 2;
	if (mr && ibv_dereg_mr(mr))
		return 2;
	if (rcq && ibv_destroy_cq(rcq))
		return 2;
	if (scq && ibv_destroy_cq(scq))
		return 2;
	if (ch && ibv_destroy_comp_channel(ch))
		return 2;
	if (pd && ibv_dealloc_pd(pd))
		return 2;
	if (ctx && ibv_close_device(ctx))
		return 2;
	return 0;
}
