/* SRQ and UD through softroce's library on one daemon. An RC pair whose
 * receiving QP takes its receives from an SRQ: the limit event arrives
 * through ibv_get_async_event for that SRQ, ibv_post_recv on the QP is
 * refused, the SRQ cannot be destroyed under it. A UD pair: the datagram
 * lands after the 40-byte GRH with IBV_WC_GRH and src_qp, and
 * ibv_create_ah_from_wc answers it. Prints "ok" on success. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static struct ibv_context *c;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

static struct ibv_qp *qp(enum ibv_qp_type t, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = t,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *q = ibv_create_qp(pd, &ia);
	if (!q)
		die("create qp type %d failed", t);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	int m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | (t == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
	if (ibv_modify_qp(q, &a, m))
		die("modify to INIT failed");
	return q;
}

static void rc_connect(struct ibv_qp *q, uint32_t dest)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest, .rq_psn = 1,
				 .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .grh = { .dgid = gid, .hop_limit = 1 }, .port_num = 1 } };
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify to RTR failed");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				      IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify to RTS failed");
}

static void ud_ready(struct ibv_qp *q)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	if (ibv_modify_qp(q, &a, IBV_QP_STATE))
		die("UD to RTR failed");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 5;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("UD to RTS failed");
}

static struct ibv_wc wait_wc(uint64_t id)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
		die("completion %d: wr_id %llu (want %llu) status %s", n, (unsigned long long)wc.wr_id,
		    (unsigned long long)id, ibv_wc_status_str(wc.status));
	return wc;
}

static void send(struct ibv_qp *q, uint64_t id, char *p, uint32_t len, uint32_t lkey, struct ibv_ah *ah, uint32_t qpn)
{
	struct ibv_sge s = { (uintptr_t)p, len, lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ah) {
		w.wr.ud.ah = ah;
		w.wr.ud.remote_qpn = qpn;
		w.wr.ud.remote_qkey = 0x11111111;
	}
	if (ibv_post_send(q, &w, &bad))
		die("post send failed");
}

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		die("no device");
	c = ibv_open_device(l[0]);
	pd = c ? ibv_alloc_pd(c) : NULL;
	cq = c ? ibv_create_cq(c, 64, NULL, NULL, 0) : NULL;
	char *buf = calloc(1, 1 << 16);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr || !cq || ibv_query_gid(c, 1, 0, &gid))
		die("setup failed");
	struct ibv_device_attr da;
	if (ibv_query_device(c, &da) || da.max_srq == 0 || da.max_srq_wr == 0 || da.max_srq_sge == 0)
		die("query device: no SRQs");

	/* SRQ */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	if (!srq || si.attr.max_wr < 8)
		die("create srq failed");
	struct ibv_qp *a = qp(IBV_QPT_RC, NULL), *b = qp(IBV_QPT_RC, srq);
	struct ibv_recv_wr rw[4], *badr;
	struct ibv_sge rs[4];
	for (int i = 0; i < 4; i++) {
		rs[i] = (struct ibv_sge){ (uintptr_t)buf + 4096 * (i + 1), 4096, mr->lkey };
		rw[i] = (struct ibv_recv_wr){ .wr_id = 100 + i, .sg_list = &rs[i], .num_sge = 1, .next = i < 3 ? &rw[i + 1] : NULL };
	}
	if (ibv_post_srq_recv(srq, &rw[0], &badr))
		die("post srq recv failed");
	struct ibv_recv_wr own = { .wr_id = 9, .sg_list = &rs[0], .num_sge = 1 };
	if (ibv_post_recv(b, &own, &badr) == 0)
		die("post recv on a QP with an SRQ accepted");
	struct ibv_srq_attr sa = { .srq_limit = 3 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT))
		die("modify srq failed");
	if (ibv_query_srq(srq, &sa) || sa.srq_limit != 3 || sa.max_sge != 1)
		die("query srq: limit %u max_sge %u", sa.srq_limit, sa.max_sge);
	rc_connect(a, b->qp_num);
	rc_connect(b, a->qp_num);
	strcpy(buf, "through the SRQ");
	for (int i = 0; i < 2; i++) {
		send(a, 1 + i, buf, 16, mr->lkey, NULL, 0);
		for (int k = 0; k < 2; k++) { /* the send's and the receive's, in either order */
			struct ibv_wc wc;
			int n;
			while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
				;
			if (n != 1 || wc.status != IBV_WC_SUCCESS)
				die("srq completion: %s", ibv_wc_status_str(wc.status));
			if (wc.opcode == IBV_WC_RECV && (wc.wr_id != 100u + i || wc.qp_num != b->qp_num || wc.byte_len != 16))
				die("srq receive wr_id %llu qp %u len %u", (unsigned long long)wc.wr_id, wc.qp_num, wc.byte_len);
		}
	}
	if (strcmp(buf + 4096, "through the SRQ") || strcmp(buf + 8192, "through the SRQ"))
		die("the SRQ's buffers lack the message");
	struct ibv_async_event ev;
	if (ibv_get_async_event(c, &ev))
		die("get async event failed");
	if (ev.event_type != IBV_EVENT_SRQ_LIMIT_REACHED || ev.element.srq != srq)
		die("event %s, want SRQ limit reached", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	if (ibv_query_srq(srq, &sa) || sa.srq_limit != 0)
		die("the limit did not disarm: %u", sa.srq_limit);
	if (ibv_destroy_srq(srq) == 0)
		die("destroyed an SRQ with a QP on it");
	struct ibv_qp_attr ea = { .qp_state = IBV_QPS_ERR };
	if (ibv_modify_qp(b, &ea, IBV_QP_STATE))
		die("modify to ERR failed");
	if (ibv_get_async_event(c, &ev))
		die("get async event failed");
	if (ev.event_type != IBV_EVENT_QP_LAST_WQE_REACHED || ev.element.qp != b)
		die("event %s, want last WQE reached for the SRQ's QP", ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	{
		struct ibv_wc fw;
		while (ibv_poll_cq(cq, 1, &fw) > 0) /* the SRQ's WQEs stay; nothing of b's is left to flush */
			;
	}

	/* UD */
	struct ibv_qp *u1 = qp(IBV_QPT_UD, NULL), *u2 = qp(IBV_QPT_UD, NULL);
	ud_ready(u1);
	ud_ready(u2);
	struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = gid, .hop_limit = 64 }, .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	aa.is_global = 0;
	if (!ah || ibv_create_ah(pd, &aa))
		die("create ah: %p; without a GRH accepted?", (void *)ah);
	char *r2 = buf + 20000, *r1 = buf + 30000;
	struct ibv_sge g2 = { (uintptr_t)r2, 40 + 100, mr->lkey }, g1 = { (uintptr_t)r1, 40 + 100, mr->lkey };
	struct ibv_recv_wr w2 = { .wr_id = 200, .sg_list = &g2, .num_sge = 1 }, w1 = { .wr_id = 201, .sg_list = &g1, .num_sge = 1 };
	if (ibv_post_recv(u2, &w2, &badr) || ibv_post_recv(u1, &w1, &badr))
		die("UD post recv failed");
	strcpy(buf + 40000, "datagram");
	send(u1, 3, buf + 40000, 9, mr->lkey, ah, u2->qp_num);
	wait_wc(3);
	struct ibv_wc wc = wait_wc(200);
	if (!(wc.wc_flags & IBV_WC_GRH) || wc.src_qp != u1->qp_num || wc.byte_len != 40 + 9 || strcmp(r2 + 40, "datagram"))
		die("UD receive: flags %#x src_qp %u (want %u) len %u data %s", wc.wc_flags, wc.src_qp, u1->qp_num, wc.byte_len,
		    r2 + 40);
	struct ibv_ah *back = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)r2, 1);
	if (!back)
		die("create ah from wc failed");
	strcpy(buf + 40100, "answer");
	send(u2, 4, buf + 40100, 7, mr->lkey, back, wc.src_qp);
	wait_wc(4);
	wc = wait_wc(201);
	if (wc.src_qp != u2->qp_num || strcmp(r1 + 40, "answer"))
		die("UD answer: src_qp %u data %s", wc.src_qp, r1 + 40);

	/* The extended send API on a UD QP: ibv_wr_set_ud_addr. */
	struct ibv_qp_init_attr_ex ix = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD, .pd = pd,
					  .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					  .send_ops_flags = IBV_QP_EX_WITH_SEND,
					  .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *u3 = ibv_create_qp_ex(c, &ix);
	if (!u3)
		die("create UD qp ex failed");
	struct ibv_qp_attr ua = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	if (ibv_modify_qp(u3, &ua, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("modify UD qp ex failed");
	ud_ready(u3);
	if (ibv_post_recv(u2, &w2, &badr))
		die("UD post recv failed");
	strcpy(buf + 40200, "extended");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(u3);
	ibv_wr_start(qx);
	qx->wr_id = 5;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_ud_addr(qx, ah, u2->qp_num, 0x11111111);
	ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf + 40200, 9);
	if (ibv_wr_complete(qx))
		die("wr_complete failed");
	wait_wc(5);
	wc = wait_wc(200);
	if (wc.src_qp != u3->qp_num || strcmp(r2 + 40, "extended"))
		die("UD extended send: src_qp %u data %s", wc.src_qp, r2 + 40);
	if (ibv_destroy_qp(u3))
		die("destroy qp ex failed");

	if (ibv_destroy_ah(ah) || ibv_destroy_ah(back) || ibv_destroy_qp(u1) || ibv_destroy_qp(u2) || ibv_destroy_qp(b) ||
	    ibv_destroy_qp(a) || ibv_destroy_srq(srq) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) ||
	    ibv_close_device(c))
		die("teardown failed");
	ibv_free_device_list(l);
	puts("ok");
	return 0;
}
