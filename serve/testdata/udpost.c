/* ibv_post_recv on a UD QP returns only once the daemon holds the
 * receive (a datagram finding none would be lost): the test stops the
 * daemon's data path, tells us to post, and watches for "posted". */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		die("no device");
	struct ibv_context *c = ibv_open_device(l[0]);
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	struct ibv_cq *cq = c ? ibv_create_cq(c, 4, NULL, NULL, 0) : NULL;
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr || !cq)
		die("setup failed");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 1 };
	if (!qp || ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("UD QP setup failed");
	printf("ready\n");
	fflush(stdout);
	if (getchar() == EOF)
		die("no go");
	struct ibv_sge s = { (uintptr_t)buf, 1000, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &w, &bad))
		die("post recv failed");
	printf("posted\n");
	fflush(stdout);
	return 0;
}
