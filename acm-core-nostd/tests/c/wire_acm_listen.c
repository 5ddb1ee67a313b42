/* Fixture capture helper (not run by the tests): attaches a UD QP to an ibacm multicast group
 * (the group must exist: the stock provider joined it) and writes the first class-0x2C MAD it
 * receives to a file. With a madtool path it then answers like the target node's acmp would:
 * `madtool acm-respond` (acm-core-nostd's parser + encoder) builds the response, which is sent
 * unicast with a GRH to the requester's QP.
 * Runs under umad2sim + simverbs as one simulated HCA; see tests/fixtures/regen_acm.sh.
 * usage: wire_acm_listen <mgid-32-hex> <mlid> <out.bin> <timeout-s> [<madtool>] */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOTS 16
#define SLOT (40 + 256)

static int die(const char *what)
{
	perror(what);
	return 1;
}

static int respond(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq,
		   struct ibv_qp *qp, const unsigned char *grh, const struct ibv_wc *wc,
		   const char *madtool, const char *req)
{
	static unsigned char resp[256];
	char cmd[16384], path[4096];
	FILE *f;

	(void) ctx;
	snprintf(path, sizeof(path), "%s.resp", req);
	snprintf(cmd, sizeof(cmd), "'%s' acm-respond '%s' '%s'", madtool, req, path);
	if (system(cmd) != 0)
		return die("madtool acm-respond");
	f = fopen(path, "rb");
	if (!f || fread(resp, 1, sizeof(resp), f) != sizeof(resp))
		return die(path);
	fclose(f);
	struct ibv_ah_attr aa = { .dlid = wc->slid, .sl = wc->sl, .port_num = 1, .is_global = 1 };
	memcpy(aa.grh.dgid.raw, grh + 8, 16); /* the requester's GID: the GRH SGID */
	aa.grh.sgid_index = 0;
	aa.grh.hop_limit = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		return die("ibv_create_ah");
	struct ibv_mr *mr = ibv_reg_mr(pd, resp, sizeof(resp), 0);
	if (!mr)
		return die("ibv_reg_mr(resp)");
	struct ibv_sge sge = { .addr = (uintptr_t) resp, .length = sizeof(resp), .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 99, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	swr.wr.ud.ah = ah;
	swr.wr.ud.remote_qpn = wc->src_qp;
	swr.wr.ud.remote_qkey = 0x80010000;
	if (ibv_post_send(qp, &swr, &bad))
		return die("ibv_post_send");
	for (int tries = 0; tries < 500; tries++) {
		struct ibv_wc swc;
		int got = ibv_poll_cq(cq, 1, &swc);
		if (got > 0 && swc.wr_id == 99) {
			fprintf(stderr, "response sent: status %d\n", swc.status);
			return swc.status == IBV_WC_SUCCESS ? 0 : 1;
		}
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "no send completion\n");
	return 1;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	union ibv_gid mgid;
	static unsigned char buf[SLOTS * SLOT];
	int i, n;

	if ((argc != 5 && argc != 6) || strlen(argv[1]) != 32) {
		fprintf(stderr, "usage: %s <mgid-32-hex> <mlid> <out.bin> <timeout-s> [<madtool>]\n",
			argv[0]);
		return 2;
	}
	for (i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(argv[1] + 2 * i, "%2x", &v) != 1)
			return 2;
		mgid.raw[i] = (uint8_t) v;
	}
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		return die("ibv_get_device_list");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		return die("ibv_open_device");
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, SLOTS * 2, NULL, NULL, 0) : NULL;
	if (!cq)
		return die("pd/cq");
	struct ibv_qp_init_attr qia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 1, .max_recv_wr = SLOTS, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &qia);
	if (!qp)
		return die("ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qkey = 0x80010000 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		return die("INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return die("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		return die("RTS");
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		return die("ibv_reg_mr");
	for (i = 0; i < SLOTS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t) (buf + i * SLOT), .length = SLOT,
				       .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			return die("ibv_post_recv");
	}
	if (ibv_attach_mcast(qp, &mgid, (uint16_t) strtoul(argv[2], NULL, 0)))
		return die("ibv_attach_mcast");
	fprintf(stderr, "listening: qpn 0x%x\n", qp->qp_num);
	time_t end = time(NULL) + atoi(argv[4]);
	while (time(NULL) < end) {
		struct ibv_wc wc;
		int got = ibv_poll_cq(cq, 1, &wc);
		if (got < 0)
			return die("ibv_poll_cq");
		if (got == 0) {
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
			continue;
		}
		unsigned char *mad = buf + wc.wr_id * SLOT + 40;
		fprintf(stderr, "wc status %d len %u slid %u src_qp 0x%x class 0x%02x\n", wc.status,
			wc.byte_len, wc.slid, wc.src_qp, mad[1]);
		if (wc.status == IBV_WC_SUCCESS && wc.byte_len >= SLOT && mad[1] == 0x2c) {
			FILE *f = fopen(argv[3], "wb");
			if (!f || fwrite(mad, 1, 256, f) != 256 || fclose(f))
				return die(argv[3]);
			ibv_detach_mcast(qp, &mgid, (uint16_t) strtoul(argv[2], NULL, 0));
			if (argc == 6)
				return respond(ctx, pd, cq, qp, buf + wc.wr_id * SLOT, &wc, argv[5],
					       argv[3]);
			return 0;
		}
	}
	fprintf(stderr, "timeout\n");
	return 1;
}
