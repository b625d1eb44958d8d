/* Loopback addresses on a daemon whose device has another address
 * (testdata of TestCMLoopback): argv[1] is the device's address, argv[2]
 * a free rdma_cm port. As the kernel's rdma_cm (cma_any_addr):
 * - rdma_bind_addr to 127.0.0.1 or ::1 succeeds on no device (id->verbs
 *   NULL), keeping the address and choosing a port;
 * - a listener bound so listens on the device: a REQ to the device's
 *   address at that port comes to it;
 * - rdma_resolve_addr to 127.0.0.1 resolves to the first device, the
 *   source becoming 127.0.0.1; rdma_resolve_route then fails with ENODEV,
 *   as on the kernel's RoCE ports (rxe's too). */
#include "cm_common.h"

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch, *cch;
	struct rdma_cm_id *lid, *id6, *lo, *cli;
	struct rdma_cm_event *ev;
	struct sockaddr_in a, *src;
	struct sockaddr_in6 a6;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	int port;

	if (argc != 3)
		return 2;
	port = atoi(argv[2]);
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK((cch = rdma_create_event_channel()) != NULL);

	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	sin_of(&a, "127.0.0.1", port);
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&a) == 0);
	CHECK(lid->verbs == NULL);
	src = (struct sockaddr_in *)rdma_get_local_addr(lid);
	CHECK(src->sin_family == AF_INET && src->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
	CHECK(ntohs(rdma_get_src_port(lid)) == port);
	CHECK(rdma_listen(lid, 4) == 0);

	CHECK(rdma_create_id(ch, &id6, NULL, RDMA_PS_TCP) == 0);
	memset(&a6, 0, sizeof(a6));
	a6.sin6_family = AF_INET6;
	a6.sin6_addr = in6addr_loopback;
	CHECK(rdma_bind_addr(id6, (struct sockaddr *)&a6) == 0);
	CHECK(id6->verbs == NULL && rdma_get_src_port(id6) != 0);
	CHECK(rdma_destroy_id(id6) == 0);

	CHECK(rdma_create_id(cch, &lo, NULL, RDMA_PS_TCP) == 0);
	sin_of(&a, "127.0.0.1", port);
	CHECK(rdma_resolve_addr(lo, NULL, (struct sockaddr *)&a, 2000) == 0);
	ev = next(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(ev->status == 0);
	rdma_ack_cm_event(ev);
	CHECK(lo->verbs != NULL);
	CHECK(strcmp(ibv_get_device_name(lo->verbs->device), "softroce0") == 0);
	src = (struct sockaddr_in *)rdma_get_local_addr(lo);
	CHECK(src->sin_family == AF_INET && src->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
	errno = 0;
	CHECK(rdma_resolve_route(lo, 2000) == -1 && errno == ENODEV);
	CHECK(!readable(cch, 200));
	CHECK(rdma_destroy_id(lo) == 0);

	cli = client(cch, argv[1], port);
	CHECK(rdma_connect(cli, &cp) == 0);
	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == lid);
	CHECK(ev->id->verbs != NULL);
	CHECK(rdma_reject(ev->id, NULL, 0) == 0);
	rdma_ack_cm_event(ev);
	ev = next(cch, RDMA_CM_EVENT_REJECTED);
	rdma_ack_cm_event(ev);
	printf("ok\n");
	return 0;
}
