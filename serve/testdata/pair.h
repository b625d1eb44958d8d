/* Two RC QPs of one process connected to each other through the device's
 * GID 0, for the C test programs; rc_to_rts serves programs whose peer
 * is elsewhere too. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

struct pair {
	struct ibv_context *c;
	struct ibv_pd *pd;
	struct ibv_cq *cqa, *cqb; /* one each: a QP's completions never wait behind the other's */
	struct ibv_qp *qa, *qb; /* qa: the requester; qb: the responder, created with ibv_create_qp_ex */
	struct ibv_qp_ex *qbx;
};

/* rc_to_rts moves an RC QP from RESET to RTS facing QP dest at gid (path
 * MTU 1024, local and remote writes and reads allowed), receiving from
 * rq_psn, sending from sq_psn, taking rd_atomic reads as responder. */
static void rc_to_rts(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid, uint32_t rq_psn, uint32_t sq_psn, uint8_t rd_atomic)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("to INIT: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = rd_atomic;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("to RTR: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				      IBV_QP_MAX_QP_RD_ATOMIC))
		die("to RTS: %s", strerror(errno));
}

static void to_rts(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	rc_to_rts(qp, dest, gid, 1, 1, 1);
}

/* pair_connect (re)creates both QPs, connected: after a remote access
 * error has put them in ERR, the test goes on with fresh ones. */
static void pair_connect(struct pair *p)
{
	union ibv_gid gid;
	if (p->qa && (ibv_destroy_qp(p->qa) || ibv_destroy_qp(p->qb)))
		die("destroy QPs");
	struct ibv_qp_init_attr ia = { .send_cq = p->cqa, .recv_cq = p->cqa, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp_init_attr_ex ix = { .send_cq = p->cqb, .recv_cq = p->cqb, .qp_type = IBV_QPT_RC, .cap = ia.cap,
					  .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = p->pd,
					  .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV |
							    IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE };
	p->qa = ibv_create_qp(p->pd, &ia);
	p->qb = ibv_create_qp_ex(p->c, &ix);
	if (!p->qa || !p->qb || !(p->qbx = ibv_qp_to_qp_ex(p->qb)))
		die("create QPs: %s", strerror(errno));
	if (ibv_query_gid(p->c, 1, 0, &gid))
		die("query gid");
	to_rts(p->qa, p->qb->qp_num, &gid);
	to_rts(p->qb, p->qa->qp_num, &gid);
}

static void pair_open(struct pair *p)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	memset(p, 0, sizeof(*p));
	p->c = l && l[0] ? ibv_open_device(l[0]) : NULL;
	p->pd = p->c ? ibv_alloc_pd(p->c) : NULL;
	p->cqa = p->c ? ibv_create_cq(p->c, 64, NULL, NULL, 0) : NULL;
	p->cqb = p->c ? ibv_create_cq(p->c, 64, NULL, NULL, 0) : NULL;
	if (!p->cqa || !p->cqb)
		die("setup failed: %s", strerror(errno));
	pair_connect(p);
}

/* wait_wc polls qp's CQ for its next completion, skipping those of QPs
 * pair_connect replaced. */
static struct ibv_wc wait_wc(struct pair *p, struct ibv_qp *qp)
{
	struct ibv_wc wc;
	for (;;) {
		int n = ibv_poll_cq(qp == p->qa ? p->cqa : p->cqb, 1, &wc);
		if (n < 0)
			die("poll_cq");
		if (n == 1 && wc.qp_num == qp->qp_num)
			return wc;
	}
}

/* rdma posts one signaled WRITE or READ on qa and returns its status. */
static enum ibv_wc_status rdma(struct pair *p, enum ibv_wr_opcode op, struct ibv_mr *local, void *laddr, uint32_t len,
			       uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge s = { (uintptr_t)laddr, len, local->lkey };
	struct ibv_send_wr w = { .wr_id = 77, .sg_list = &s, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	if (ibv_post_send(p->qa, &w, &bad))
		die("post %d: %s", op, strerror(errno));
	struct ibv_wc wc = wait_wc(p, p->qa);
	if (wc.wr_id != 77)
		die("completion of wr %llu", (unsigned long long)wc.wr_id);
	return wc.status;
}
