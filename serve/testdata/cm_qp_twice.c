/* rdma_create_qp on an id that has a QP (testdata of
 * TestCProgramCMQPTwice): argv[1] is the daemon's address, argv[2] a free
 * rdma_cm port. The second call fails with EINVAL and changes nothing, on
 * the connecting and the accepting side: the first QPs connect and a SEND
 * crosses. */
#include "cm_common.h"

static void twice(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp *qp = id->qp;
	struct ibv_cq *scq = id->send_cq, *rcq = id->recv_cq;
	CHECK(qp != NULL);
	errno = 0;
	CHECK(rdma_create_qp(id, NULL, &qa) == -1 && errno == EINVAL);
	CHECK(id->qp == qp && id->send_cq == scq && id->recv_cq == rcq);
}

static struct ibv_wc poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n, i;
	for (i = 0; i < 10000000; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
	}
	printf("no completion\n");
	exit(1);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *sch, *cch;
	struct rdma_cm_id *cli, *sid;
	struct rdma_cm_event *ev;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	char sbuf[64] = "through the first QP", rbuf[64] = { 0 };
	struct ibv_mr *smr, *rmr;
	struct ibv_sge ss, rs;
	struct ibv_send_wr swr = { 0 }, *bs;
	struct ibv_recv_wr rwr = { 0 }, *br;
	struct ibv_wc wc;

	if (argc != 3)
		return 2;
	CHECK((sch = rdma_create_event_channel()) != NULL);
	CHECK((cch = rdma_create_event_channel()) != NULL);
	listener(sch, argv[1], atoi(argv[2]));
	cli = client(cch, argv[1], atoi(argv[2]));
	twice(cli);
	CHECK(rdma_connect(cli, &cp) == 0);
	ev = next(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(sid, NULL, &qa) == 0);
	twice(sid);
	CHECK((rmr = ibv_reg_mr(sid->pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE)) != NULL);
	rs = (struct ibv_sge){ (uintptr_t)rbuf, sizeof(rbuf), rmr->lkey };
	rwr.sg_list = &rs;
	rwr.num_sge = 1;
	CHECK(ibv_post_recv(sid->qp, &rwr, &br) == 0);
	CHECK(rdma_accept(sid, &cp) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next(sch, RDMA_CM_EVENT_ESTABLISHED));

	CHECK((smr = ibv_reg_mr(cli->pd, sbuf, sizeof(sbuf), 0)) != NULL);
	ss = (struct ibv_sge){ (uintptr_t)sbuf, sizeof(sbuf), smr->lkey };
	swr.sg_list = &ss;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(cli->qp, &swr, &bs) == 0);
	wc = poll1(cli->send_cq);
	CHECK(wc.status == IBV_WC_SUCCESS);
	wc = poll1(sid->recv_cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV);
	CHECK(strcmp(rbuf, sbuf) == 0);

	CHECK(rdma_disconnect(cli) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(next(sch, RDMA_CM_EVENT_DISCONNECTED));
	printf("ok\n");
	return 0;
}
