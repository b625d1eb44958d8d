/* rdma_migrate_id (testdata of TestCProgramCMMigrate): argv[1] is the
 * daemon's address, argv[2] a free rdma_cm port.
 *
 * 1. A server moves a CONNECT_REQUEST's id to a channel of its own before
 *    acking the event (Ceph's accept path), then accepts: ESTABLISHED and
 *    DISCONNECTED come there, and nothing on the listener's channel.
 * 2. An id accepted on the listener's channel whose ESTABLISHED is queued
 *    but not yet taken: migrating moves that event, and the old channel's
 *    fd is no longer readable.
 * 3. Migrating to NULL makes the id synchronous (calls wait for their
 *    event, nothing comes on the old channel); a synchronous id cannot be
 *    migrated to NULL again (EINVAL) and returns to a channel.
 * 4. A listener migrated with a CONNECT_REQUEST queued takes the request
 *    along. */
#include "cm_common.h"
#include <unistd.h>

static const char *ip;
static int port;

static void accept_it(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7 };
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
	CHECK(rdma_accept(id, &p) == 0);
}

static void teardown(struct rdma_cm_id *cli, struct rdma_event_channel *cch, struct rdma_event_channel *sch)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *sid;
	CHECK(rdma_disconnect(cli) == 0);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_DISCONNECTED));
	ev = next(sch, RDMA_CM_EVENT_DISCONNECTED);
	sid = ev->id;
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(sid);
	CHECK(rdma_destroy_id(sid) == 0);
	rdma_destroy_qp(cli);
	CHECK(rdma_destroy_id(cli) == 0);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *lch, *nch, *cch;
	struct rdma_cm_id *lid, *cli, *sid;
	struct rdma_cm_event *ev;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };

	if (argc != 3)
		return 2;
	ip = argv[1];
	port = atoi(argv[2]);
	CHECK((lch = rdma_create_event_channel()) != NULL);
	CHECK((nch = rdma_create_event_channel()) != NULL);
	CHECK((cch = rdma_create_event_channel()) != NULL);
	lid = listener(lch, ip, port);

	/* 1 */
	cli = client(cch, ip, port);
	CHECK(rdma_connect(cli, &cp) == 0);
	ev = next(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	CHECK(ev->listen_id == lid);
	CHECK(rdma_migrate_id(sid, nch) == 0); /* the event is not acked yet */
	CHECK(sid->channel == nch);
	rdma_ack_cm_event(ev);
	accept_it(sid);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ESTABLISHED));
	ev = next(nch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev->id == sid);
	rdma_ack_cm_event(ev);
	CHECK(!readable(lch, 300));
	teardown(cli, cch, nch);
	CHECK(!readable(lch, 300));
	CHECK(!readable(nch, 0));

	/* 2 */
	cli = client(cch, ip, port);
	CHECK(rdma_connect(cli, &cp) == 0);
	ev = next(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
	sid = ev->id;
	rdma_ack_cm_event(ev);
	accept_it(sid);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ESTABLISHED));
	CHECK(readable(lch, 10000)); /* the server's ESTABLISHED, queued */
	usleep(100000);
	CHECK(rdma_migrate_id(sid, nch) == 0);
	CHECK(!readable(lch, 300));
	ev = next(nch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(ev->id == sid);
	rdma_ack_cm_event(ev);
	teardown(cli, cch, nch);
	CHECK(!readable(lch, 300));

	/* 3 */
	{
		struct rdma_cm_id *id;
		struct sockaddr_in dst;
		sin_of(&dst, ip, port);
		CHECK(rdma_create_id(cch, &id, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_migrate_id(id, NULL) == 0);
		CHECK(id->channel && id->channel != cch);
		CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
		CHECK(id->event && id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED);
		CHECK(id->verbs != NULL);
		CHECK(rdma_resolve_route(id, 2000) == 0);
		CHECK(id->event && id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED);
		CHECK(!readable(cch, 300));
		errno = 0;
		CHECK(rdma_migrate_id(id, NULL) == -1 && errno == EINVAL);
		CHECK(rdma_migrate_id(id, cch) == 0);
		CHECK(id->channel == cch && id->event == NULL);
		CHECK(rdma_destroy_id(id) == 0);
	}

	/* 4 */
	cli = client(cch, ip, port);
	CHECK(rdma_connect(cli, &cp) == 0);
	CHECK(readable(lch, 10000));
	usleep(100000);
	CHECK(rdma_migrate_id(lid, nch) == 0);
	CHECK(!readable(lch, 300));
	ev = next(nch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == lid);
	sid = ev->id;
	CHECK(sid->channel == nch);
	rdma_ack_cm_event(ev);
	accept_it(sid);
	rdma_ack_cm_event(next(cch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next(nch, RDMA_CM_EVENT_ESTABLISHED));
	teardown(cli, cch, nch);
	CHECK(!readable(lch, 300));

	CHECK(rdma_destroy_id(lid) == 0);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(nch);
	rdma_destroy_event_channel(lch);
	printf("ok\n");
	return 0;
}
