/* Helpers of the rdma_cm test programs: each prints "ok" on success, or
 * the failed check and exits 1. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define CHECK(c)                                                                          \
	do {                                                                              \
		if (!(c)) {                                                               \
			printf("%s:%d: %s (errno %d: %s)\n", __FILE__, __LINE__, #c, errno, \
			       strerror(errno));                                           \
			exit(1);                                                          \
		}                                                                         \
	} while (0)

/* readable waits up to ms for the channel's fd: 1 if an event is there. */
static int readable(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1;
}

/* next takes the channel's next event, which must be of type want. */
static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	if (!readable(ch, 10000)) {
		printf("no %s within 10 s\n", rdma_event_str(want));
		exit(1);
	}
	CHECK(rdma_get_cm_event(ch, &ev) == 0);
	if (ev->event != want) {
		printf("got %s (status %d), want %s\n", rdma_event_str(ev->event), ev->status, rdma_event_str(want));
		exit(1);
	}
	return ev;
}

static void sin_of(struct sockaddr_in *s, const char *ip, int port)
{
	memset(s, 0, sizeof(*s));
	s->sin_family = AF_INET;
	s->sin_port = htons(port);
	CHECK(inet_pton(AF_INET, ip, &s->sin_addr) == 1);
}

/* client resolves ip:port on a new id of ch and gives it a QP. */
static struct rdma_cm_id *client(struct rdma_event_channel *ch, const char *ip, int port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in dst;
	struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	sin_of(&dst, ip, port);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(rdma_resolve_route(id, 2000) == 0);
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
	return id;
}

/* listener binds ip:port on a new id of ch and listens. */
static struct rdma_cm_id *listener(struct rdma_event_channel *ch, const char *ip, int port)
{
	struct rdma_cm_id *id;
	struct sockaddr_in a;
	sin_of(&a, ip, port);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&a) == 0);
	CHECK(rdma_listen(id, 8) == 0);
	return id;
}
