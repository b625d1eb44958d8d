/* Receives posted before rdma_accept, with no RNR retries (testdata of
 * TestCMAcceptTakesPostedRecvs): "server IP PORT" listens, creates the
 * accepting QP, says "ready", waits for a line on stdin, posts NMSG
 * receives and accepts at once; "client IP PORT" connects and sends NMSG
 * SENDs as soon as it is ESTABLISHED. Both sides pass rnr_retry_count 0,
 * so a SEND that finds no receive fails the client's QP
 * (IBV_WC_RNR_RETRY_EXC_ERR) instead of being retried. Each prints "ok". */
#include <time.h>
#include "cm_common.h"

#define NMSG 4

static struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 0 };

/* poll_n takes n completions of cq within 10 s, each of status SUCCESS. */
static void poll_n(struct ibv_cq *cq, int n, const char *what)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	while (n > 0) {
		int k = ibv_poll_cq(cq, 1, &wc);
		CHECK(k >= 0);
		if (k == 0) {
			if (time(NULL) > end) {
				printf("%s: no completion within 10 s\n", what);
				exit(1);
			}
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS) {
			printf("%s: %s\n", what, ibv_wc_status_str(wc.status));
			exit(1);
		}
		n--;
	}
}

static void server(const char *ip, int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = NMSG, .max_recv_wr = NMSG, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	static char buf[NMSG][64];
	struct ibv_mr *mr;
	char line[16];

	CHECK((ch = rdma_create_event_channel()) != NULL);
	listener(ch, ip, port);
	printf("listening\n");
	fflush(stdout);
	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = ev->id;
	rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
	CHECK((mr = ibv_reg_mr(id->pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE)) != NULL);
	printf("ready\n");
	fflush(stdout);
	CHECK(fgets(line, sizeof(line), stdin) != NULL);
	for (int i = 0; i < NMSG; i++) {
		struct ibv_sge s = { (uintptr_t)buf[i], sizeof(buf[i]), mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &s, .num_sge = 1 }, *bad;
		CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0);
	}
	CHECK(rdma_accept(id, &cp) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
	poll_n(id->recv_cq, NMSG, "receive");
	printf("ok\n");
}

static void client_side(const char *ip, int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	static char buf[64] = "sent at once";
	struct ibv_mr *mr;

	CHECK((ch = rdma_create_event_channel()) != NULL);
	id = client(ch, ip, port);
	CHECK((mr = ibv_reg_mr(id->pd, buf, sizeof(buf), 0)) != NULL);
	CHECK(rdma_connect(id, &cp) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ESTABLISHED));
	for (int i = 0; i < NMSG; i++) {
		struct ibv_sge s = { (uintptr_t)buf, sizeof(buf), mr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		CHECK(ibv_post_send(id->qp, &wr, &bad) == 0);
	}
	poll_n(id->send_cq, NMSG, "send");
	printf("ok\n");
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	if (strcmp(argv[1], "server") == 0)
		server(argv[2], atoi(argv[3]));
	else
		client_side(argv[2], atoi(argv[3]));
	return 0;
}
