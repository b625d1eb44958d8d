/* READ/atomic depths through rdma_cm as librdmacm sets them (testdata of
 * TestCProgramCMMaxDepth): argv[1] is the daemon's address, argv[2] a free
 * rdma_cm port. RDMA_MAX_RESP_RES and RDMA_MAX_INIT_DEPTH on connect are
 * the device's limits, on accept what the request asked up to them; the
 * REQ and REP carry those numbers, never 0xFF, and each side's events
 * show what the other sent. A depth above the limit is EINVAL. */
#include "cm_common.h"

static struct ibv_device_attr dev;

/* conn connects a new client with cp, accepts it with ap and checks what
 * each side's event says the other sent. */
static void conn(struct rdma_event_channel *sch, const char *ip, int port, struct rdma_conn_param *cp,
		 struct rdma_conn_param *ap, int req_resp, int req_init, int rep_resp, int rep_init)
{
	struct rdma_event_channel *cch;
	struct rdma_cm_id *cli, *sid;
	struct rdma_cm_event *ev;
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };

	CHECK((cch = rdma_create_event_channel()) != NULL);
	cli = client(cch, ip, port);
	CHECK(rdma_connect(cli, cp) == 0);
	ev = next(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	/* Seen from the listener: responder_resources is the requester's
	 * initiator depth, initiator_depth its responder resources. */
	if (ev->param.conn.initiator_depth != req_resp || ev->param.conn.responder_resources != req_init) {
		printf("REQ: responder_resources %d, initiator_depth %d; want %d, %d\n", ev->param.conn.initiator_depth,
		       ev->param.conn.responder_resources, req_resp, req_init);
		exit(1);
	}
	rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(sid, NULL, &qa) == 0);
	CHECK(rdma_accept(sid, ap) == 0);
	ev = next(cch, RDMA_CM_EVENT_ESTABLISHED);
	if (ev->param.conn.initiator_depth != rep_resp || ev->param.conn.responder_resources != rep_init) {
		printf("REP: responder_resources %d, initiator_depth %d; want %d, %d\n", ev->param.conn.initiator_depth,
		       ev->param.conn.responder_resources, rep_resp, rep_init);
		exit(1);
	}
	rdma_ack_cm_event(ev);
	rdma_ack_cm_event(next(sch, RDMA_CM_EVENT_ESTABLISHED));
	CHECK(rdma_disconnect(cli) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(next(sch, RDMA_CM_EVENT_DISCONNECTED));
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *sch, *cch;
	struct rdma_cm_id *lid, *cli;
	struct rdma_conn_param max = { .responder_resources = RDMA_MAX_RESP_RES, .initiator_depth = RDMA_MAX_INIT_DEPTH,
				       .retry_count = 7, .rnr_retry_count = 7 };
	struct rdma_conn_param small = { .responder_resources = 3, .initiator_depth = 2, .retry_count = 7, .rnr_retry_count = 7 };
	struct rdma_conn_param big = { .responder_resources = 200, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	int port, rd, ird;

	if (argc != 3)
		return 2;
	port = atoi(argv[2]);
	CHECK((sch = rdma_create_event_channel()) != NULL);
	lid = listener(sch, argv[1], port);
	CHECK(ibv_query_device(lid->verbs, &dev) == 0);
	rd = dev.max_qp_rd_atom;
	ird = dev.max_qp_init_rd_atom;
	CHECK(rd > 3 && rd < 200 && ird > 3 && ird < 200);

	/* Both sides at RDMA_MAX_*: the limits. */
	conn(sch, argv[1], port, &max, &max, rd, ird, rd, ird);
	/* A request for less: the acceptor's RDMA_MAX_* gives that much. */
	conn(sch, argv[1], port, &small, &max, 3, 2, 2, 3);
	/* No parameters: the limits on connect, the request's on accept. */
	conn(sch, argv[1], port, NULL, NULL, rd, ird, rd, ird);
	conn(sch, argv[1], port, &small, NULL, 3, 2, 2, 3);

	CHECK((cch = rdma_create_event_channel()) != NULL);
	cli = client(cch, argv[1], port);
	errno = 0;
	CHECK(rdma_connect(cli, &big) == -1 && errno == EINVAL);
	printf("ok\n");
	return 0;
}
