/* A receive naming a key the program does not own: the daemon moves the
 * QP to ERR and ibv_get_async_event reports IBV_EVENT_QP_FATAL for it;
 * the receive then completes as flushed. Prints "ok" on success. */
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		die("no device");
	struct ibv_context *c = ibv_open_device(l[0]);
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	char *buf = malloc(10000);
	strcpy(buf, "kept");
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf + 100, 5000, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_cq *cq = c ? ibv_create_cq(c, 4, NULL, NULL, 0) : NULL;
	if (!mr || !cq)
		die("setup failed");
	if (strcmp(buf, "kept"))
		die("registration changed the memory around the buffer");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		die("create qp failed");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify to INIT failed");
	/* Unsupported verbs fail cleanly. */
	union ibv_gid mgid = { .raw = { 0xff } };
	if (ibv_attach_mcast(qp, &mgid, 0) != EOPNOTSUPP)
		die("multicast attached?");
	struct ibv_sge good = { (uintptr_t)buf + 100, 100, mr->lkey };
	struct ibv_sge bad = { (uintptr_t)buf + 100, 100, mr->lkey ^ 0x100 };
	struct ibv_recv_wr w1 = { .wr_id = 1, .sg_list = &good, .num_sge = 1 };
	struct ibv_recv_wr w2 = { .wr_id = 2, .sg_list = &bad, .num_sge = 1 };
	struct ibv_recv_wr *badwr;
	if (ibv_post_recv(qp, &w1, &badwr) || ibv_post_recv(qp, &w2, &badwr))
		die("post recv failed");
	struct ibv_async_event ev;
	if (ibv_get_async_event(c, &ev))
		die("get async event failed");
	if (ev.event_type != IBV_EVENT_QP_FATAL || ev.element.qp != qp)
		die("event %s, qp %p, want QP fatal for %p", ibv_event_type_str(ev.event_type), (void *)ev.element.qp, (void *)qp);
	ibv_ack_async_event(&ev);
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n != 1 || wc.wr_id != 1 || wc.status != IBV_WC_WR_FLUSH_ERR)
		die("completion %d: wr_id %llu status %s", n, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) || ibv_close_device(c))
		die("teardown failed");
	ibv_free_device_list(l);
	if (strcmp(buf, "kept"))
		die("the buffer's page lost its contents");
	puts("ok");
	return 0;
}
