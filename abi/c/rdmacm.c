/*
 * softroce's librdmacm.so.1: the rdma_cm API of <rdma/rdma_cma.h>, with
 * connection management done by the daemon's CM (package cm, serve/cm.go).
 * An event channel is a connection to the daemon plus a pipe the daemon
 * writes a byte to per event. Verbs objects are softroce's libibverbs'
 * (the cm_id's verbs context is an ibv_context of that library), and the
 * daemon moves the QP through its states from the CM's parameters.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "softroce_proto.h"
#include "softroce_cm.h"
#include "softroce_sock.h"

#define EXPORT __attribute__((visibility("default")))

_Static_assert(sizeof(struct sr_sockaddr) == 24, "sockaddr");
_Static_assert(sizeof(struct sr_cm_req) == 352, "cm req");
_Static_assert(sizeof(struct sr_cm_resp) == 64, "cm resp");
_Static_assert(sizeof(struct sr_cm_event) == 344, "cm event");

/* ---- the daemon ---- */

/* The path and the checks of the daemon: softroce_sock.h. */
static int sr_connect(void)
{
	return sr_dial(NULL, 0, NULL);
}

/* One request, one response of at most rlen bytes (and one fd if asked).
 * Returns 0 or an errno. */
static int cm_call(int sock, uint32_t op, const struct sr_cm_req *req, void *resp, size_t rlen, int *fd)
{
	char msg[sizeof(struct sr_req) + sizeof(struct sr_cm_req)];
	char in[SR_MAX_MSG];
	struct sr_req h = { .op = op };
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { msg, sizeof(msg) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *c;
	struct sr_resp r;
	ssize_t n;
	int got = -1;

	memcpy(msg, &h, sizeof(h));
	memcpy(msg + sizeof(h), req, sizeof(*req));
	do
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return ENODEV;
	iov.iov_base = in;
	iov.iov_len = sizeof(in);
	memset(&m, 0, sizeof(m));
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = ctl.buf;
	m.msg_controllen = sizeof(ctl.buf);
	do
		n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < (ssize_t)sizeof(r))
		return ENODEV;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int), i;
			int *p = (int *)CMSG_DATA(c);
			for (i = 0; i < k; i++) {
				if (fd && got < 0)
					got = p[i];
				else
					close(p[i]);
			}
		}
	}
	memcpy(&r, in, sizeof(r));
	if (r.err) {
		if (got >= 0)
			close(got);
		return r.err;
	}
	n -= sizeof(r);
	if ((size_t)n > rlen || (fd && got < 0)) {
		if (got >= 0)
			close(got);
		return EPROTO;
	}
	if (resp) {
		memset(resp, 0, rlen);
		memcpy(resp, in + sizeof(r), n);
	}
	if (fd)
		*fd = got;
	return 0;
}

static void sync_state(struct ibv_qp *qp);

static int fail(int e)
{
	errno = e;
	return -1;
}

/* ---- devices: softroce's libibverbs contexts, opened once ---- */

#define MAX_DEVS 64

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_context *dev_ctx[MAX_DEVS];
static struct ibv_pd *dev_pd[MAX_DEVS];
static int dev_count = -1;

static struct ibv_context *device(uint32_t index, struct ibv_pd **pd)
{
	struct ibv_context *ctx = NULL;

	if (index >= MAX_DEVS)
		return NULL;
	pthread_mutex_lock(&dev_lock);
	if (!dev_ctx[index]) {
		int n;
		struct ibv_device **l = ibv_get_device_list(&n);
		if (l && (int)index < n) {
			dev_ctx[index] = ibv_open_device(l[index]);
			if (dev_ctx[index])
				dev_pd[index] = ibv_alloc_pd(dev_ctx[index]);
		}
		if (l) {
			dev_count = n;
			ibv_free_device_list(l);
		}
	}
	ctx = dev_ctx[index];
	if (pd)
		*pd = dev_pd[index];
	pthread_mutex_unlock(&dev_lock);
	return ctx;
}

static int dev_index(struct ibv_context *ctx)
{
	int i;
	for (i = 0; i < MAX_DEVS; i++)
		if (dev_ctx[i] == ctx)
			return i;
	return -1;
}

EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	int n = 0, i, k = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	struct ibv_context **out;

	if (l)
		ibv_free_device_list(l);
	if (n > MAX_DEVS)
		n = MAX_DEVS;
	out = calloc(n + 1, sizeof(*out));
	if (!out) {
		errno = ENOMEM;
		return NULL;
	}
	for (i = 0; i < n; i++)
		if ((out[k] = device(i, NULL)))
			k++;
	if (num_devices)
		*num_devices = k;
	return out;
}

EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list); /* the contexts stay open for the process, as librdmacm's do */
}

/* ---- channels and ids ---- */

struct sr_chan {
	struct rdma_event_channel ch; /* fd: the event socket */
	int sock;
	uint64_t token; /* names it to MIGRATE_ID */
	pthread_mutex_t lock;
	struct sr_id *ids;
	volatile int dead; /* destroyed by the program */
};

/* Events handed out and not yet acked, per id (sr_id.events): an id's
 * count outlives a move to another channel, so one lock for all. */
static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_acked = PTHREAD_COND_INITIALIZER;

struct sr_id {
	struct rdma_cm_id id;
	uint32_t handle;
	struct sr_chan *chan;
	struct sr_id *next;
	bool sync; /* created without a channel: calls wait for their event */
	bool own_cqs;
	struct rdma_cm_event *pending; /* a sync id's event */
	int events; /* handed out and not yet acked: rdma_destroy_id waits for them */
};

struct sr_event {
	struct rdma_cm_event ev;
	struct sr_id *owner; /* whose events count it is in */
	uint8_t priv[SR_CM_PRIVATE];
};

static int chan_call(struct sr_chan *c, uint32_t op, struct sr_cm_req *q, void *resp, size_t rlen)
{
	int e;
	pthread_mutex_lock(&c->lock);
	e = cm_call(c->sock, op, q, resp, rlen, NULL);
	pthread_mutex_unlock(&c->lock);
	return e;
}

EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct sr_chan *c = calloc(1, sizeof(*c));
	struct sr_cm_req q = { 0 };
	struct sr_cm_resp r;
	int e, fd = -1;

	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->sock = sr_connect();
	if (c->sock < 0) {
		free(c);
		errno = ENODEV;
		return NULL;
	}
	e = cm_call(c->sock, SR_OP_CM_OPEN, &q, &r, sizeof(r), &fd);
	if (e) {
		close(c->sock);
		free(c);
		errno = e;
		return NULL;
	}
	c->ch.fd = fd;
	c->token = r.token;
	pthread_mutex_init(&c->lock, NULL);
	return &c->ch;
}

EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct sr_chan *c = (struct sr_chan *)channel;
	if (!c)
		return;
	/* Programs destroy a channel while another thread still waits in
	 * rdma_get_cm_event on it (rping does): with librdmacm that read
	 * never returns. The struct is kept (a few bytes per channel) so that
	 * thread finds it marked dead and waits likewise, rather than
	 * failing on a freed channel or on the daemon's EOF. */
	c->dead = 1;
	close(c->ch.fd);
	close(c->sock);
}

static void dead_wait(void)
{
	for (;;)
		pause();
}

static struct sr_id *find_id(struct sr_chan *c, uint32_t h)
{
	struct sr_id *i;
	for (i = c->ids; i; i = i->next)
		if (i->handle == h)
			return i;
	return NULL;
}

static struct sr_id *new_id_locked(struct sr_chan *c, uint32_t handle, void *context, enum rdma_port_space ps,
				   enum ibv_qp_type qpt)
{
	struct sr_id *i = calloc(1, sizeof(*i));
	if (!i)
		return NULL;
	i->handle = handle;
	i->chan = c;
	i->id.channel = &c->ch;
	i->id.context = context;
	i->id.ps = ps;
	i->id.qp_type = qpt;
	i->next = c->ids;
	c->ids = i;
	return i;
}

static struct sr_id *new_id(struct sr_chan *c, uint32_t handle, void *context, enum rdma_port_space ps,
			    enum ibv_qp_type qpt)
{
	struct sr_id *i;
	pthread_mutex_lock(&c->lock);
	i = new_id_locked(c, handle, context, ps, qpt);
	pthread_mutex_unlock(&c->lock);
	return i;
}

static void unlink_id_locked(struct sr_id *i)
{
	struct sr_id **p;
	for (p = &i->chan->ids; *p; p = &(*p)->next)
		if (*p == i) {
			*p = i->next;
			break;
		}
}

static void unlink_id(struct sr_id *i)
{
	struct sr_chan *c = i->chan;
	pthread_mutex_lock(&c->lock);
	unlink_id_locked(i);
	pthread_mutex_unlock(&c->lock);
}

static enum ibv_qp_type ps_qp_type(enum rdma_port_space ps)
{
	return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
}

static int create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		     enum rdma_port_space ps, enum ibv_qp_type qpt)
{
	struct sr_chan *c = (struct sr_chan *)channel;
	struct sr_cm_req q = { .ps = ps, .qp_type = qpt };
	struct sr_cm_resp r;
	struct sr_id *i;
	bool sync = false;
	int e;

	if (!id)
		return fail(EINVAL);
	if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB)
		return fail(EPROTONOSUPPORT);
	if (!c) {
		if (!(channel = rdma_create_event_channel()))
			return -1;
		c = (struct sr_chan *)channel;
		sync = true;
	}
	e = chan_call(c, SR_OP_CM_CREATE_ID, &q, &r, sizeof(r));
	if (e || !(i = new_id(c, r.id, context, ps, qpt))) {
		if (sync)
			rdma_destroy_event_channel(channel);
		return fail(e ? e : ENOMEM);
	}
	i->sync = sync;
	*id = &i->id;
	return 0;
}

EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			  enum rdma_port_space ps)
{
	return create_id(channel, id, context, ps, ps_qp_type(ps));
}

static void to_sr(struct sr_sockaddr *o, const struct sockaddr *a)
{
	memset(o, 0, sizeof(*o));
	if (!a)
		return;
	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)a;
		o->family = AF_INET;
		o->port = ntohs(s->sin_port);
		memcpy(o->addr, &s->sin_addr, 4);
	} else if (a->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const void *)a;
		o->family = AF_INET6;
		o->port = ntohs(s->sin6_port);
		o->scope_id = s->sin6_scope_id;
		memcpy(o->addr, &s->sin6_addr, 16);
	} else {
		o->family = 0xffff; /* refused by the daemon */
	}
}

static void from_sr(void *storage, const struct sr_sockaddr *a)
{
	if (a->family == AF_INET) {
		struct sockaddr_in *s = storage;
		memset(s, 0, sizeof(*s));
		s->sin_family = AF_INET;
		s->sin_port = htons(a->port);
		memcpy(&s->sin_addr, a->addr, 4);
	} else if (a->family == AF_INET6) {
		struct sockaddr_in6 *s = storage;
		memset(s, 0, sizeof(*s));
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(a->port);
		s->sin6_scope_id = a->scope_id;
		memcpy(&s->sin6_addr, a->addr, 16);
	}
}

static void gid_of(union ibv_gid *g, const struct sr_sockaddr *a)
{
	memset(g, 0, sizeof(*g));
	if (a->family == AF_INET) {
		g->raw[10] = g->raw[11] = 0xff;
		memcpy(g->raw + 12, a->addr, 4);
	} else if (a->family == AF_INET6) {
		memcpy(g->raw, a->addr, 16);
	}
}

/* sgid_index finds the index of GID g on port 1 of ctx: a device on an
 * interface with an IPv6 link-local address has that address at index 0
 * and its IPv4 address after it, as a kernel RoCE device has, so the
 * index of an id's source GID is looked up, not assumed (0 when absent,
 * the one GID of a device without a link-local address). */
static uint8_t sgid_index(struct ibv_context *ctx, const union ibv_gid *g)
{
	struct ibv_port_attr pa;
	union ibv_gid x;
	int n, k;

	if (!ctx || ibv_query_port(ctx, 1, &pa))
		return 0;
	n = pa.gid_tbl_len < 256 ? pa.gid_tbl_len : 256;
	for (k = 0; k < n; k++)
		if (!ibv_query_gid(ctx, 1, k, &x) && !memcmp(&x, g, sizeof(x)))
			return (uint8_t)k;
	return 0;
}

/* update copies what the daemon says of an id into its struct. */
static void update(struct sr_id *i, uint32_t dev, const struct sr_sockaddr *src, const struct sr_sockaddr *dst)
{
	if (dev != SR_CM_NODEV && !i->id.verbs) {
		struct ibv_pd *pd = NULL;
		i->id.verbs = device(dev, &pd);
		i->id.port_num = 1;
		if (!i->id.pd)
			i->id.pd = NULL; /* the application's, when it gives one */
	}
	if (src && src->family) {
		from_sr(&i->id.route.addr.src_storage, src);
		gid_of(&i->id.route.addr.addr.ibaddr.sgid, src);
	}
	if (dst && dst->family) {
		from_sr(&i->id.route.addr.dst_storage, dst);
		gid_of(&i->id.route.addr.addr.ibaddr.dgid, dst);
	}
	i->id.route.addr.addr.ibaddr.pkey = htons(0xffff);
}

static int id_call(struct rdma_cm_id *id, uint32_t op, struct sr_cm_req *q)
{
	struct sr_id *i = (struct sr_id *)id;
	struct sr_cm_resp r;
	int e;

	q->id = i->handle;
	e = chan_call(i->chan, op, q, &r, sizeof(r));
	if (e)
		return fail(e);
	if (r.id == i->handle)
		update(i, r.dev, &r.src, &r.dst);
	return 0;
}

/* wait_sync takes a sync id's event and fails unless it is the one
 * wanted, as librdmacm's synchronous calls do. */
static int wait_sync(struct rdma_cm_id *id, enum rdma_cm_event_type want)
{
	struct sr_id *i = (struct sr_id *)id;
	struct rdma_cm_event *ev;
	int st;

	if (!i->sync)
		return 0;
	if (rdma_get_cm_event(id->channel, &ev))
		return -1;
	if (i->pending)
		rdma_ack_cm_event(i->pending);
	i->pending = ev;
	id->event = ev;
	st = ev->status;
	if (ev->event != want)
		return fail(st < 0 ? -st : ECONNREFUSED);
	return 0;
}

EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct sr_cm_req q = { 0 };
	if (!id || !addr)
		return fail(EINVAL);
	to_sr(&q.src, addr);
	return id_call(id, SR_OP_CM_BIND, &q);
}

EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr, int timeout_ms)
{
	struct sr_cm_req q = { .timeout_ms = timeout_ms };
	if (!id || !dst_addr)
		return fail(EINVAL);
	to_sr(&q.src, src_addr);
	to_sr(&q.dst, dst_addr);
	if (id_call(id, SR_OP_CM_RESOLVE_ADDR, &q))
		return -1;
	return wait_sync(id, RDMA_CM_EVENT_ADDR_RESOLVED);
}

EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct sr_cm_req q = { .timeout_ms = timeout_ms };
	if (!id)
		return fail(EINVAL);
	if (id_call(id, SR_OP_CM_RESOLVE_ROUTE, &q))
		return -1;
	return wait_sync(id, RDMA_CM_EVENT_ROUTE_RESOLVED);
}

EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct sr_cm_req q = { .ps = backlog > 0 ? backlog : 0 };
	if (!id)
		return fail(EINVAL);
	return id_call(id, SR_OP_CM_LISTEN, &q);
}

static void put_param(struct sr_cm_req *q, struct rdma_conn_param *p, bool connect)
{
	if (!p) {
		if (connect) {
			/* librdmacm's defaults for a NULL conn_param: the
			 * device's READ/atomic depths (the daemon reads 0xFF,
			 * RDMA_MAX_*, so), seven retries */
			q->param.valid = 1;
			q->param.responder_resources = RDMA_MAX_RESP_RES;
			q->param.initiator_depth = RDMA_MAX_INIT_DEPTH;
			q->param.retry_count = 7;
			q->param.rnr_retry_count = 7;
		}
		return;
	}
	q->param.valid = 1;
	q->param.responder_resources = p->responder_resources;
	q->param.initiator_depth = p->initiator_depth;
	q->param.flow_control = p->flow_control;
	q->param.retry_count = p->retry_count;
	q->param.rnr_retry_count = p->rnr_retry_count;
	q->param.srq = p->srq;
	q->qpn = p->qp_num;
	if (p->private_data && p->private_data_len) {
		q->private_len = p->private_data_len;
		memcpy(q->private_data, p->private_data, p->private_data_len);
	}
}

EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct sr_cm_req q = { 0 };
	if (!id)
		return fail(EINVAL);
	put_param(&q, conn_param, true);
	if (id_call(id, SR_OP_CM_CONNECT, &q))
		return -1;
	return wait_sync(id, RDMA_CM_EVENT_ESTABLISHED);
}

EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	struct sr_cm_req q = { 0 };
	if (!id)
		return fail(EINVAL);
	put_param(&q, conn_param, false);
	if (id->qp)
		q.qpn = id->qp->qp_num;
	if (id_call(id, SR_OP_CM_ACCEPT, &q))
		return -1;
	sync_state(id->qp); /* in RTS now, as after librdmacm's rdma_accept */
	if (id->qp_type == IBV_QPT_UD || id->ps == RDMA_PS_UDP)
		return 0;
	return wait_sync(id, RDMA_CM_EVENT_ESTABLISHED);
}

EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	struct sr_cm_req q = { 0 };
	if (!id)
		return fail(EINVAL);
	if (private_data && private_data_len) {
		q.private_len = private_data_len;
		memcpy(q.private_data, private_data, private_data_len);
	}
	return id_call(id, SR_OP_CM_REJECT, &q);
}

EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct sr_cm_req q = { 0 };
	if (!id)
		return fail(EINVAL);
	return id_call(id, SR_OP_CM_DISCONNECT, &q);
}

EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct sr_id *i = (struct sr_id *)id;
	struct sr_cm_req q = { 0 };
	if (!id)
		return fail(EINVAL);
	id_call(id, SR_OP_CM_DESTROY_ID, &q);
	if (i->pending)
		rdma_ack_cm_event(i->pending);
	/* As librdmacm: wait until its events are acked, so a thread still
	 * handling one does not use a freed id. */
	pthread_mutex_lock(&ev_lock);
	while (i->events > 0)
		pthread_cond_wait(&ev_acked, &ev_lock);
	pthread_mutex_unlock(&ev_lock);
	unlink_id(i);
	if (i->sync)
		rdma_destroy_event_channel(id->channel);
	free(i);
	return 0;
}

/* rdma_migrate_id moves the id to another channel of the process, as
 * librdmacm's: its events not yet taken move there in the daemon (in
 * order), later ones come there only, and the call returns once the
 * events already handed out on the old channel are acked. A NULL channel
 * gives the id a channel of its own and makes it synchronous; a
 * synchronous id must be given one (EINVAL). */
EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct sr_id *i = (struct sr_id *)id;
	struct sr_chan *from, *to, *a, *b;
	struct sr_cm_req q = { 0 };
	struct sr_cm_resp r;
	bool sync = false;
	int e;

	if (!id)
		return fail(EINVAL);
	if (i->sync && !channel)
		return fail(EINVAL);
	if (!channel) {
		if (!(channel = rdma_create_event_channel()))
			return -1;
		sync = true;
	}
	from = i->chan;
	to = (struct sr_chan *)channel;
	if (to != from) {
		/* Both channels are held so that no GET_EVENT on either hands
		 * out an event of the id under a handle the library does not
		 * know there yet. */
		a = from < to ? from : to;
		b = from < to ? to : from;
		pthread_mutex_lock(&a->lock);
		pthread_mutex_lock(&b->lock);
		q.id = i->handle;
		q.chan_token = to->token;
		e = cm_call(from->sock, SR_OP_CM_MIGRATE_ID, &q, &r, sizeof(r), NULL);
		if (!e) {
			unlink_id_locked(i);
			i->handle = r.id;
			i->chan = to;
			id->channel = channel;
			i->next = to->ids;
			to->ids = i;
		}
		pthread_mutex_unlock(&b->lock);
		pthread_mutex_unlock(&a->lock);
		if (e) {
			if (sync)
				rdma_destroy_event_channel(channel);
			return fail(e);
		}
		if (i->sync) {
			/* its own channel, which nothing else uses */
			if (i->pending) {
				rdma_ack_cm_event(i->pending);
				i->pending = NULL;
				id->event = NULL;
			}
			rdma_destroy_event_channel(&from->ch);
		}
	}
	pthread_mutex_lock(&ev_lock);
	i->sync = sync;
	while (i->events > 0)
		pthread_cond_wait(&ev_acked, &ev_lock);
	pthread_mutex_unlock(&ev_lock);
	return 0;
}

EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	(void)optval;
	if (!id)
		return fail(EINVAL);
	/* TOS, REUSEADDR, AFONLY, ACK_TIMEOUT: accepted; the CM keeps its
	 * own values. Anything else is refused as librdmacm does. */
	if (level == RDMA_OPTION_ID && (optname == RDMA_OPTION_ID_TOS || optname == RDMA_OPTION_ID_REUSEADDR ||
					 optname == RDMA_OPTION_ID_AFONLY || optname == RDMA_OPTION_ID_ACK_TIMEOUT))
		return optlen ? 0 : fail(EINVAL);
	return fail(ENOSYS);
}

/* ---- QPs ---- */

/* sync_state refreshes the QP state libibverbs caches (post_send and
 * post_recv check it) after the daemon moved the QP. */
static void sync_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (qp)
		ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
}

/* Weak: loaded with another libibverbs, attach fails with EINVAL (the
 * daemon's QPs are only softroce's libibverbs') instead of the library
 * failing to load. */
extern int softroce_qp_token(struct ibv_qp *qp, uint64_t *token) __attribute__((weak));

static int attach(struct rdma_cm_id *id, struct ibv_qp *qp)
{
	struct sr_cm_req q = { .qpn = qp->qp_num };
	if (!softroce_qp_token || softroce_qp_token(qp, &q.qp_token))
		return fail(EINVAL);
	if (id_call(id, SR_OP_CM_ATTACH_QP, &q))
		return -1;
	sync_state(qp);
	return 0;
}

EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	struct sr_id *i = (struct sr_id *)id;
	struct ibv_qp_init_attr a;
	struct ibv_pd *pd, *dpd = NULL;
	struct ibv_qp *qp;

	if (!id || !attr || !id->verbs)
		return fail(EINVAL);
	if (id->qp) /* as librdmacm: one QP per id, the first one kept */
		return fail(EINVAL);
	device(dev_index(id->verbs), &dpd);
	pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) && attr->pd ? attr->pd : (id->pd ? id->pd : dpd);
	if (!pd || pd->context != id->verbs)
		return fail(EINVAL);
	memset(&a, 0, sizeof(a));
	a.qp_context = attr->qp_context;
	a.send_cq = attr->send_cq;
	a.recv_cq = attr->recv_cq;
	a.srq = attr->srq;
	a.cap = attr->cap;
	a.qp_type = attr->qp_type;
	a.sq_sig_all = attr->sq_sig_all;
	if (!a.send_cq || !a.recv_cq) {
		/* librdmacm makes the CQs an id lacks, with completion channels */
		int n = a.cap.max_send_wr + a.cap.max_recv_wr;
		struct ibv_comp_channel *cc = ibv_create_comp_channel(id->verbs);
		struct ibv_cq *cq = cc ? ibv_create_cq(id->verbs, n ? n : 1, id, cc, 0) : NULL;
		if (!cq) {
			if (cc)
				ibv_destroy_comp_channel(cc);
			return -1;
		}
		a.send_cq = a.send_cq ? a.send_cq : cq;
		a.recv_cq = a.recv_cq ? a.recv_cq : cq;
		id->send_cq = id->recv_cq = cq;
		id->send_cq_channel = id->recv_cq_channel = cc;
		i->own_cqs = true;
	}
	qp = ibv_create_qp(pd, &a);
	if (!qp)
		return -1;
	if (attach(id, qp)) {
		int e = errno;
		ibv_destroy_qp(qp);
		return fail(e);
	}
	attr->cap = a.cap;
	id->qp = qp;
	id->pd = pd;
	return 0;
}

EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex a;
	int ret;

	if (!qp_init_attr)
		return fail(EINVAL);
	memset(&a, 0, sizeof(a));
	memcpy(&a, qp_init_attr, sizeof(*qp_init_attr));
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd;
	ret = rdma_create_qp_ex(id, &a);
	if (!ret)
		qp_init_attr->cap = a.cap;
	return ret;
}

EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	struct sr_id *i = (struct sr_id *)id;
	struct sr_cm_req q = { 0 };
	if (!id || !id->qp)
		return;
	id_call(id, SR_OP_CM_DETACH_QP, &q);
	ibv_destroy_qp(id->qp);
	id->qp = NULL;
	if (i->own_cqs) {
		ibv_destroy_cq(id->send_cq);
		ibv_destroy_comp_channel(id->send_cq_channel);
		id->send_cq = id->recv_cq = NULL;
		id->send_cq_channel = id->recv_cq_channel = NULL;
		i->own_cqs = false;
	}
}

EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask)
{
	if (!id || !qp_attr || !qp_attr_mask)
		return fail(EINVAL);
	if (qp_attr->qp_state != IBV_QPS_INIT)
		return fail(EOPNOTSUPP); /* the daemon moves the QP to RTR and RTS */
	qp_attr->pkey_index = 0;
	qp_attr->port_num = 1;
	*qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (id->qp_type == IBV_QPT_UD) {
		qp_attr->qkey = RDMA_UDP_QKEY;
		*qp_attr_mask |= IBV_QP_QKEY;
	} else {
		qp_attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		*qp_attr_mask |= IBV_QP_ACCESS_FLAGS;
	}
	return 0;
}

/* ---- events ---- */

EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct sr_chan *c = (struct sr_chan *)channel;
	struct sr_cm_req q = { 0 };
	struct sr_cm_event e;
	struct sr_event *ev;
	struct sr_id *i, *owner;
	char b;
	ssize_t n;
	int err;

	if (!c || !event)
		return fail(EINVAL);
	for (;;) {
		n = read(c->ch.fd, &b, 1);
		if (n < 0 && errno == EINTR)
			return -1; /* a signal ends the wait, as with the kernel's ucma */
		if (c->dead)
			dead_wait();
		if (n < 0)
			return -1; /* EAGAIN on a non-blocking channel */
		if (n == 0)
			return fail(ENODEV); /* the daemon is gone */
		ev = calloc(1, sizeof(*ev));
		if (!ev)
			return fail(ENOMEM);
		/* The event and its id are taken under one hold of the channel,
		 * so rdma_migrate_id sees the event as handed out or not at all. */
		pthread_mutex_lock(&c->lock);
		err = cm_call(c->sock, SR_OP_CM_GET_EVENT, &q, &e, sizeof(e), NULL);
		i = owner = NULL;
		if (!err) {
			/* As librdmacm, a CONNECT_REQUEST counts as the listener's
			 * event (the new id has had none): so the new id can be
			 * migrated before the request is acked. */
			i = owner = find_id(c, e.event == RDMA_CM_EVENT_CONNECT_REQUEST ? e.listen_id : e.id);
			if (i && e.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
				ev->ev.listen_id = &i->id;
				i = new_id_locked(c, e.id, i->id.context, i->id.ps, i->id.qp_type);
			}
			if (i) {
				pthread_mutex_lock(&ev_lock);
				owner->events++;
				pthread_mutex_unlock(&ev_lock);
			}
		}
		pthread_mutex_unlock(&c->lock);
		if (c->dead)
			dead_wait();
		if (err) {
			free(ev);
			if (err == EAGAIN)
				continue;
			return fail(err);
		}
		if (!i) {
			free(ev); /* for an id destroyed meanwhile (or no memory for the new one) */
			continue;
		}
		ev->owner = owner;
		ev->ev.event = e.event;
		ev->ev.status = e.status;
		ev->ev.id = &i->id;
		update(i, e.dev, &e.src, &e.dst);
		if (e.private_len > SR_CM_PRIVATE)
			e.private_len = SR_CM_PRIVATE;
		memcpy(ev->priv, e.private_data, e.private_len);
		if (ev->ev.id->qp_type == IBV_QPT_UD || ev->ev.id->ps == RDMA_PS_UDP) {
			struct rdma_ud_param *u = &ev->ev.param.ud;
			u->private_data = e.private_len ? ev->priv : NULL;
			u->private_data_len = e.private_len > 255 ? 255 : e.private_len;
			u->qp_num = e.qp_num;
			u->qkey = e.qkey;
			if (e.event == RDMA_CM_EVENT_ESTABLISHED) {
				u->ah_attr.is_global = 1;
				u->ah_attr.port_num = 1;
				u->ah_attr.grh.hop_limit = 64;
				u->ah_attr.grh.sgid_index = sgid_index(i->id.verbs, &i->id.route.addr.addr.ibaddr.sgid);
				gid_of(&u->ah_attr.grh.dgid, &e.dst);
			}
		} else {
			struct rdma_conn_param *p = &ev->ev.param.conn;
			p->private_data = e.private_len ? ev->priv : NULL;
			p->private_data_len = e.private_len > 255 ? 255 : e.private_len;
			p->responder_resources = e.param.responder_resources;
			p->initiator_depth = e.param.initiator_depth;
			p->flow_control = e.param.flow_control;
			p->retry_count = e.param.retry_count;
			p->rnr_retry_count = e.param.rnr_retry_count;
			p->srq = e.param.srq;
			p->qp_num = e.qp_num;
		}
		/* Only ESTABLISHED: later events may come while another thread
		 * destroys the QP (rping tears down as DISCONNECTED arrives);
		 * a QP in ERR needs no fresh state to flush its work. */
		if (e.event == RDMA_CM_EVENT_ESTABLISHED)
			sync_state(ev->ev.id->qp);
		*event = &ev->ev;
		return 0;
	}
}

EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	struct sr_event *ev = (struct sr_event *)event;
	if (!event)
		return fail(EINVAL);
	if (ev->owner) {
		pthread_mutex_lock(&ev_lock);
		ev->owner->events--;
		pthread_cond_broadcast(&ev_acked);
		pthread_mutex_unlock(&ev_lock);
	}
	free(event);
	return 0;
}

EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const s[] = {
		"RDMA_CM_EVENT_ADDR_RESOLVED",	  "RDMA_CM_EVENT_ADDR_ERROR",	 "RDMA_CM_EVENT_ROUTE_RESOLVED",
		"RDMA_CM_EVENT_ROUTE_ERROR",	  "RDMA_CM_EVENT_CONNECT_REQUEST", "RDMA_CM_EVENT_CONNECT_RESPONSE",
		"RDMA_CM_EVENT_CONNECT_ERROR",	  "RDMA_CM_EVENT_UNREACHABLE",	 "RDMA_CM_EVENT_REJECTED",
		"RDMA_CM_EVENT_ESTABLISHED",	  "RDMA_CM_EVENT_DISCONNECTED",	 "RDMA_CM_EVENT_DEVICE_REMOVAL",
		"RDMA_CM_EVENT_MULTICAST_JOIN",	  "RDMA_CM_EVENT_MULTICAST_ERROR", "RDMA_CM_EVENT_ADDR_CHANGE",
		"RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};
	if ((unsigned)event < sizeof(s) / sizeof(s[0]))
		return s[event];
	return "UNKNOWN EVENT";
}

EXPORT uint16_t rdma_get_src_port(struct rdma_cm_id *id)
{
	struct sockaddr *a = &id->route.addr.src_addr;
	return a->sa_family == AF_INET6 ? id->route.addr.src_sin6.sin6_port :
	       a->sa_family == AF_INET	? id->route.addr.src_sin.sin_port :
					  0;
}

EXPORT uint16_t rdma_get_dst_port(struct rdma_cm_id *id)
{
	struct sockaddr *a = &id->route.addr.dst_addr;
	return a->sa_family == AF_INET6 ? id->route.addr.dst_sin6.sin6_port :
	       a->sa_family == AF_INET	? id->route.addr.dst_sin.sin_port :
					  0;
}

/* ---- rdma_getaddrinfo: the system resolver, in rdma_addrinfo's shape ---- */

static int copy_addr(struct sockaddr **to, socklen_t *tolen, const struct sockaddr *a, socklen_t len)
{
	if (!(*to = malloc(len)))
		return -1;
	memcpy(*to, a, len);
	*tolen = len;
	return 0;
}

EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
			    struct rdma_addrinfo **res)
{
	struct addrinfo h = { .ai_socktype = SOCK_STREAM }, *ai, *a;
	struct rdma_addrinfo *head = NULL, **tail = &head;
	int e;

	if (!res || (!node && !service && !hints))
		return fail(EINVAL);
	if (!node && !service) {
		/* As librdmacm: the hints' addresses (libfabric passes its
		 * endpoints' addresses so) */
		struct rdma_addrinfo *r = calloc(1, sizeof(*r));
		if (!r)
			return fail(ENOMEM);
		r->ai_flags = hints->ai_flags;
		r->ai_family = hints->ai_family;
		r->ai_qp_type = hints->ai_qp_type;
		r->ai_port_space = hints->ai_port_space;
		if ((hints->ai_dst_len && copy_addr(&r->ai_dst_addr, &r->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len)) ||
		    (hints->ai_src_len && copy_addr(&r->ai_src_addr, &r->ai_src_len, hints->ai_src_addr, hints->ai_src_len))) {
			rdma_freeaddrinfo(r);
			return fail(ENOMEM);
		}
		*res = r;
		return 0;
	}
	if (hints) {
		h.ai_flags = (hints->ai_flags & RAI_PASSIVE ? AI_PASSIVE : 0) |
			     (hints->ai_flags & RAI_NUMERICHOST ? AI_NUMERICHOST : 0);
		h.ai_family = hints->ai_family;
		if (h.ai_family == AF_IB)
			return fail(EAFNOSUPPORT);
	}
	e = getaddrinfo(node, service, &h, &ai);
	if (e) {
		errno = e == EAI_SYSTEM ? errno : ENOENT;
		return e;
	}
	for (a = ai; a; a = a->ai_next) {
		struct rdma_addrinfo *r;
		struct sockaddr *sa;
		if (a->ai_family != AF_INET && a->ai_family != AF_INET6)
			continue;
		r = calloc(1, sizeof(*r));
		sa = malloc(a->ai_addrlen);
		if (!r || !sa) {
			free(r);
			free(sa);
			break;
		}
		memcpy(sa, a->ai_addr, a->ai_addrlen);
		r->ai_flags = hints ? hints->ai_flags : 0;
		r->ai_family = a->ai_family;
		r->ai_qp_type = hints && hints->ai_qp_type ? hints->ai_qp_type : IBV_QPT_RC;
		r->ai_port_space = hints && hints->ai_port_space ? hints->ai_port_space :
				   (r->ai_qp_type == IBV_QPT_UD ? RDMA_PS_UDP : RDMA_PS_TCP);
		if (r->ai_flags & RAI_PASSIVE) {
			r->ai_src_addr = sa;
			r->ai_src_len = a->ai_addrlen;
		} else {
			r->ai_dst_addr = sa;
			r->ai_dst_len = a->ai_addrlen;
			/* a source given in the hints is kept, as librdmacm's */
			if (hints && hints->ai_src_len &&
			    copy_addr(&r->ai_src_addr, &r->ai_src_len, hints->ai_src_addr, hints->ai_src_len)) {
				rdma_freeaddrinfo(r);
				break;
			}
		}
		*tail = r;
		tail = &r->ai_next;
	}
	freeaddrinfo(ai);
	if (!head)
		return fail(ENOENT);
	*res = head;
	return 0;
}

EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *n = res->ai_next;
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_route);
		free(res->ai_connect);
		free(res);
		res = n;
	}
}

/* ---- not supported: the documented errors ---- */

EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *qp_init_attr)
{
	(void)id, (void)res, (void)pd, (void)qp_init_attr;
	return fail(EOPNOTSUPP);
}
EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (id) {
		rdma_destroy_qp(id);
		rdma_destroy_id(id);
	}
}
EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	(void)id, (void)pd, (void)attr;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	(void)id, (void)attr;
	return fail(EOPNOTSUPP);
}
EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	(void)id;
}
EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	(void)id;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	(void)listen, (void)id;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	(void)id, (void)event;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id, (void)addr, (void)context;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *mc_join_attr, void *context)
{
	(void)id, (void)mc_join_attr, (void)context;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id, (void)addr;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id, (void)ece;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	(void)id, (void)ece;
	return fail(EOPNOTSUPP);
}
EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return rdma_reject(id, private_data, private_data_len);
}

/* rsockets: none exist here, so rpoll and rselect are poll and select
 * (the tools call rpoll on ordinary descriptors); the rest fail. */
EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	return poll(fds, nfds, timeout);
}
EXPORT int rselect(int nfds, fd_set *r, fd_set *w, fd_set *x, struct timeval *t)
{
	return select(nfds, r, w, x, t);
}
EXPORT int rsocket(int domain, int type, int protocol)
{
	(void)domain, (void)type, (void)protocol;
	return fail(EOPNOTSUPP);
}
#define RFAIL(name, ...)                 \
	EXPORT int name(__VA_ARGS__)     \
	{                                \
		return fail(EOPNOTSUPP); \
	}
#define RFAILS(name, ...)                \
	EXPORT ssize_t name(__VA_ARGS__) \
	{                                \
		return fail(EOPNOTSUPP); \
	}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
RFAIL(rbind, int s, const struct sockaddr *a, socklen_t l)
RFAIL(rlisten, int s, int b)
RFAIL(raccept, int s, struct sockaddr *a, socklen_t *l)
RFAIL(rconnect, int s, const struct sockaddr *a, socklen_t l)
RFAIL(rshutdown, int s, int how)
RFAIL(rclose, int s)
RFAILS(rrecv, int s, void *b, size_t l, int f)
RFAILS(rrecvfrom, int s, void *b, size_t l, int f, struct sockaddr *a, socklen_t *al)
RFAILS(rrecvmsg, int s, struct msghdr *m, int f)
RFAILS(rsend, int s, const void *b, size_t l, int f)
RFAILS(rsendto, int s, const void *b, size_t l, int f, const struct sockaddr *a, socklen_t al)
RFAILS(rsendmsg, int s, const struct msghdr *m, int f)
RFAILS(rread, int s, void *b, size_t l)
RFAILS(rreadv, int s, const struct iovec *v, int n)
RFAILS(rwrite, int s, const void *b, size_t l)
RFAILS(rwritev, int s, const struct iovec *v, int n)
RFAIL(rgetpeername, int s, struct sockaddr *a, socklen_t *l)
RFAIL(rgetsockname, int s, struct sockaddr *a, socklen_t *l)
RFAIL(rsetsockopt, int s, int level, int name, const void *v, socklen_t l)
RFAIL(rgetsockopt, int s, int level, int name, void *v, socklen_t *l)
RFAIL(riounmap, int s, void *b, size_t l)
EXPORT size_t riowrite(int s, const void *b, size_t c, off_t o, int f)
{
	errno = EOPNOTSUPP;
	return (size_t)-1;
}
EXPORT int rfcntl(int s, int cmd, ... /* arg */)
{
	return fail(EOPNOTSUPP);
}
EXPORT off_t riomap(int s, void *b, size_t l, int p, int f, off_t o)
{
	return fail(EOPNOTSUPP);
}
#pragma GCC diagnostic pop
