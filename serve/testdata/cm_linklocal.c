/* rdma_cm on a device's IPv6 link-local address (testdata of
 * TestCProgramCMLinkLocal): argv[1] is the device's link-local address,
 * argv[2] its interface, argv[3] a free rdma_cm port. As the kernel's
 * rdma_cm:
 * - rdma_bind_addr without a scope id fails with EINVAL;
 * - with the interface's scope id it binds to the device, and
 *   rdma_get_local_addr gives the address back with the scope id;
 * - rdma_resolve_addr to that address (no source) resolves on the device:
 *   the source is the link-local address with the destination's scope id,
 *   the source GID is GID 0, the peer address keeps its scope id;
 * - the request's new id has the addresses without a scope id. */
#include <net/if.h>
#include "cm_common.h"

static void sin6_of(struct sockaddr_in6 *s, const char *ip, int port, uint32_t scope)
{
	memset(s, 0, sizeof(*s));
	s->sin6_family = AF_INET6;
	s->sin6_port = htons(port);
	s->sin6_scope_id = scope;
	CHECK(inet_pton(AF_INET6, ip, &s->sin6_addr) == 1);
}

/* is checks that a is AF_INET6 ll with scope id scope (and port, unless 0). */
static int is(const struct sockaddr *a, const struct in6_addr *ll, uint32_t scope, int port)
{
	const struct sockaddr_in6 *s = (const void *)a;
	return s->sin6_family == AF_INET6 && !memcmp(&s->sin6_addr, ll, 16) && s->sin6_scope_id == scope &&
	       (!port || ntohs(s->sin6_port) == port);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch, *cch;
	struct rdma_cm_id *lid, *cli;
	struct rdma_cm_event *ev;
	struct sockaddr_in6 a;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7 };
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	union ibv_gid g0;
	uint32_t scope;
	int port;

	if (argc != 4)
		return 2;
	CHECK((scope = if_nametoindex(argv[2])) != 0);
	port = atoi(argv[3]);
	CHECK((ch = rdma_create_event_channel()) != NULL);
	CHECK((cch = rdma_create_event_channel()) != NULL);

	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	sin6_of(&a, argv[1], port, 0);
	errno = 0;
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&a) == -1 && errno == EINVAL);
	sin6_of(&a, argv[1], port, scope);
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&a) == 0);
	CHECK(lid->verbs != NULL);
	CHECK(is(rdma_get_local_addr(lid), &a.sin6_addr, scope, port));
	CHECK(ibv_query_gid(lid->verbs, 1, 0, &g0) == 0);
	CHECK(!memcmp(&lid->route.addr.addr.ibaddr.sgid, &g0, 16));
	CHECK(rdma_listen(lid, 4) == 0);

	CHECK(rdma_create_id(cch, &cli, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(cli, NULL, (struct sockaddr *)&a, 2000) == 0);
	ev = next(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
	rdma_ack_cm_event(ev);
	CHECK(cli->verbs != NULL);
	CHECK(is(rdma_get_local_addr(cli), &a.sin6_addr, scope, 0) && rdma_get_src_port(cli) != 0);
	CHECK(is(rdma_get_peer_addr(cli), &a.sin6_addr, scope, port));
	CHECK(!memcmp(&cli->route.addr.addr.ibaddr.sgid, &g0, 16));
	CHECK(rdma_resolve_route(cli, 2000) == 0);
	ev = next(cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(cli, NULL, &qa) == 0);
	CHECK(rdma_connect(cli, &cp) == 0);

	ev = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(ev->listen_id == lid);
	CHECK(is(rdma_get_local_addr(ev->id), &a.sin6_addr, 0, port));
	/* The peer's port is the connecting id's own, as the kernel's cma_hdr says. */
	CHECK(is(rdma_get_peer_addr(ev->id), &a.sin6_addr, 0, ntohs(rdma_get_src_port(cli))));
	CHECK(!memcmp(&ev->id->route.addr.addr.ibaddr.sgid, &g0, 16));
	CHECK(rdma_reject(ev->id, NULL, 0) == 0);
	rdma_ack_cm_event(ev);
	ev = next(cch, RDMA_CM_EVENT_REJECTED);
	rdma_ack_cm_event(ev);
	printf("ok\n");
	return 0;
}
