/* ibv_create_cq_ex and ibv_query_device_ex: receives flushed by moving the
 * QP to ERR come back through start_poll/next_poll/end_poll in order.
 * Prints "ok". */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	if (!pd)
		die("setup failed");
	struct ibv_device_attr_ex da;
	if (ibv_query_device_ex(c, NULL, &da) || da.orig_attr.max_qp_wr < 1024 || da.orig_attr.phys_port_cnt != 1)
		die("query_device_ex");
	struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	if (ibv_create_cq_ex(c, &ca) || errno != EOPNOTSUPP)
		die("timestamps: errno %d, want EOPNOTSUPP", errno);
	ca.wc_flags = IBV_WC_STANDARD_FLAGS;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(c, &ca);
	if (!cq)
		die("create_cq_ex: %s", strerror(errno));
	char *buf = malloc(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia = { .send_cq = ibv_cq_ex_to_cq(cq), .recv_cq = ibv_cq_ex_to_cq(cq), .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp)
		die("qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("init");
	struct ibv_poll_cq_attr pa = { 0 };
	if (ibv_start_poll(cq, &pa) != ENOENT)
		die("an empty CQ polled something");
	for (int i = 0; i < 5; i++) {
		struct ibv_sge s = { (uintptr_t)buf + i * 100, 100, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qp, &w, &bad))
			die("post recv");
	}
	a.qp_state = IBV_QPS_ERR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		die("to ERR");
	int got = 0, e;
	while (got < 5) {
		while ((e = ibv_start_poll(cq, &pa)) == ENOENT)
			;
		if (e)
			die("start_poll %d", e);
		do {
			if (cq->wr_id != (uint64_t)(100 + got) || cq->status != IBV_WC_WR_FLUSH_ERR ||
			    ibv_wc_read_qp_num(cq) != qp->qp_num)
				die("CQE %d: wr_id %llu status %d", got, (unsigned long long)cq->wr_id, cq->status);
			got++;
		} while ((e = ibv_next_poll(cq)) == 0);
		if (e != ENOENT)
			die("next_poll %d", e);
		ibv_end_poll(cq);
	}
	if (ibv_start_poll(cq, &pa) != ENOENT)
		die("more CQEs than WQEs");
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(ibv_cq_ex_to_cq(cq)))
		die("teardown");
	puts("ok");
	return 0;
}
