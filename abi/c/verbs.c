/*
 * libibverbs.so.1 for softroce: the verbs an unmodified program calls,
 * compiled against the system's <infiniband/verbs.h> so every struct is
 * laid out as the program expects. Control goes to the daemon over a Unix
 * socket (softroce_proto.h); post_send, post_recv and poll_cq work on
 * shared rings with no system call, except a doorbell write when the
 * daemon said it sleeps. No transport logic lives here.
 */
#define _GNU_SOURCE
/* Names that also have a compat version are defined as sr_impl_NAME and
 * bound to NAME@@VERSION there (generated from libibverbs_exports.txt).
 * The two the header redefines as macros are renamed where defined. */
#include "compat.h"
#undef ibv_query_port
#undef ibv_reg_mr
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <endian.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sched.h>
#include <unistd.h>

#define SR_YIELD_AFTER 64

#include "softroce_proto.h"
#include "softroce_sock.h"

#define EXPORT __attribute__((visibility("default")))

_Static_assert(sizeof(struct ibv_wc) <= SR_CQE_SIZE, "ibv_wc fits a CQE slot");
_Static_assert(offsetof(struct ibv_wc, qp_num) == 28, "ibv_wc layout");
_Static_assert(offsetof(struct ibv_wc, wc_flags) == 36, "ibv_wc layout");
_Static_assert(sizeof(struct sr_send_wqe) == 80, "send WQE");
_Static_assert(sizeof(struct sr_qp_attr) == 128, "qp attr");
_Static_assert(sizeof(struct sr_dev_attr) == 96, "dev attr");

/* ---- the socket ---- */

/* The path and the checks of the daemon: softroce_sock.h. */
static int sr_connect(void)
{
	return sr_dial(NULL, 0, NULL);
}

/*
 * sr_call sends one request (with fds) and reads its response: the body
 * must be exactly rlen bytes (or at least rlen when var is set). It
 * returns 0 or an errno, and the fds the response carried.
 */
static int sr_call_v(int sock, uint32_t op, const void *body, size_t blen, const int *fds, int nfds,
		     void *resp, size_t rlen, bool var, size_t *got, int *rfds, int maxr)
{
	char msg[SR_MAX_MSG];
	char in[SR_MAX_MSG + 1];
	struct sr_req h = { .op = op };
	union {
		char buf[CMSG_SPACE(sizeof(int) * SR_MAX_EXTENTS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr m;
	struct cmsghdr *c;
	ssize_t n;
	int nr = 0, i;

	if (sizeof(h) + blen > sizeof(msg) || nfds > SR_MAX_EXTENTS)
		return EINVAL;
	memcpy(msg, &h, sizeof(h));
	if (blen)
		memcpy(msg + sizeof(h), body, blen);
	iov.iov_base = msg;
	iov.iov_len = sizeof(h) + blen;
	memset(&m, 0, sizeof(m));
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (nfds > 0) {
		m.msg_control = ctl.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	do
		n = sendmsg(sock, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EPIPE ? ENODEV : errno;

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
	if (n <= 0)
		return ENODEV;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int *p = (int *)CMSG_DATA(c);
			for (i = 0; i < k; i++) {
				if (nr < maxr)
					rfds[nr++] = p[i];
				else
					close(p[i]);
			}
		}
	}
	if ((size_t)n < sizeof(struct sr_resp))
		goto bad;
	struct sr_resp r;
	memcpy(&r, in, sizeof(r));
	if (r.err) {
		for (i = 0; i < nr; i++)
			close(rfds[i]);
		return r.err;
	}
	n -= sizeof(r);
	if ((size_t)n < rlen || (!var && (size_t)n != rlen) || nr != maxr)
		goto bad;
	if (var) /* resp has room for SR_MAX_MSG bytes */
		*got = n;
	memcpy(resp, in + sizeof(r), var ? (size_t)n : rlen);
	return 0;
bad:
	for (i = 0; i < nr; i++)
		close(rfds[i]);
	return EPROTO;
}

static int sr_call(int sock, uint32_t op, const void *body, size_t blen, void *resp, size_t rlen)
{
	return sr_call_v(sock, op, body, blen, NULL, 0, resp, rlen, false, NULL, NULL, 0);
}

static int sr_call_fd(int sock, uint32_t op, const void *body, size_t blen, void *resp, size_t rlen, int *fd)
{
	return sr_call_v(sock, op, body, blen, NULL, 0, resp, rlen, false, NULL, fd, 1);
}

/* ---- objects ---- */

struct sr_device {
	struct ibv_device dev;
	int index;
	uint64_t guid;
};

struct sr_context {
	struct verbs_context vctx; /* its struct ibv_context is last */
	int sock;
	int bell;
	pthread_mutex_t lock; /* serialises control calls */
	pthread_mutex_t cqs_lock;
	struct sr_cq *cqs; /* for ibv_get_cq_event */
	struct sr_qp *qps; /* for ibv_get_async_event */
	struct sr_srq *srqs; /* verbs_ud.c: for ibv_get_async_event */
};

struct sr_pd {
	struct ibv_pd pd;
	uint32_t h;
};

struct extent;

struct sr_mr {
	struct ibv_mr mr;
	uint32_t h;
	int next; /* the extents the MR holds a reference on */
	struct extent **ext;
};

struct sr_cq {
	union { /* ibv_cq_ex begins with the fields of ibv_cq */
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;
	};
	struct ibv_wc cur; /* the CQE between start_poll/next_poll and end_poll */
	bool cur_valid; /* cur is a CQE not yet consumed */
	uint32_t h;
	uint8_t *map;
	size_t len;
	uint32_t size, cons;
	uint32_t empty; /* polls in a row that found nothing */
	pthread_spinlock_t lock;
	struct sr_cq *next;
};

struct sr_qp {
	union { /* ibv_qp_ex begins with its ibv_qp */
		struct ibv_qp qp;
		struct ibv_qp_ex qpx;
	};
	bool ex; /* made by ibv_create_qp_ex with send ops */
	uint32_t h;
	uint64_t token; /* sr_qp_resp.token */
	uint8_t *map;
	size_t len;
	uint32_t sq_size, rq_size, sq_stride, rq_stride;
	uint8_t *sq, *rq;
	uint32_t sq_prod, rq_prod;
	uint32_t max_send_sge, max_recv_sge, max_inline;
	int bell;
	pthread_spinlock_t sq_lock, rq_lock;
	struct ibv_qp_cap cap;
	struct sr_qp *next;
	/* Between ibv_wr_start and ibv_wr_complete: WQEs built, not published. */
	uint32_t wr_prod, wr_cons;
	uint8_t *wr_cur;
	int wr_err;
};

struct sr_channel {
	struct ibv_comp_channel ch;
	uint32_t h;
};

static inline struct sr_context *to_ctx(struct ibv_context *c)
{
	return (struct sr_context *)((uint8_t *)c - offsetof(struct sr_context, vctx.context));
}

static inline _Atomic uint32_t *at32(uint8_t *base, size_t off)
{
	return (_Atomic uint32_t *)(base + off);
}

static int ctx_call(struct ibv_context *c, uint32_t op, const void *b, size_t bl, void *r, size_t rl, int *fd)
{
	struct sr_context *x = to_ctx(c);
	int e;

	pthread_mutex_lock(&x->lock);
	e = fd ? sr_call_fd(x->sock, op, b, bl, r, rl, fd) : sr_call(x->sock, op, b, bl, r, rl);
	pthread_mutex_unlock(&x->lock);
	return e;
}

/* ---- devices ---- */

static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sr_device *devs; /* kept for the process's life, as rdma-core keeps devices */
static int ndevs;

EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	char buf[SR_MAX_MSG];
	struct sr_hello_resp h;
	struct ibv_device **list;
	size_t got = 0;
	int sock, i, n;

	if (num)
		*num = 0;
	pthread_mutex_lock(&devs_lock);
	if (!devs) {
		sock = sr_dial(buf, sizeof(buf), &got);
		if (sock >= 0) {
			close(sock);
			memcpy(&h, buf, sizeof(h));
			n = h.ndev;
			if (n > (int)((got - sizeof(h)) / sizeof(struct sr_dev_entry)))
				n = (got - sizeof(h)) / sizeof(struct sr_dev_entry);
			devs = calloc(n > 0 ? n : 1, sizeof(*devs));
			for (i = 0; devs && i < n; i++) {
				struct sr_dev_entry de;
				memcpy(&de, buf + sizeof(h) + i * sizeof(de), sizeof(de));
				de.name[SR_NAME_LEN - 1] = 0;
				struct ibv_device *d = &devs[i].dev;
				d->node_type = IBV_NODE_CA;
				d->transport_type = IBV_TRANSPORT_IB;
				snprintf(d->name, sizeof(d->name), "%s", de.name);
				snprintf(d->dev_name, sizeof(d->dev_name), "uverbs%d", i);
				snprintf(d->dev_path, sizeof(d->dev_path), "/sys/class/infiniband_verbs/uverbs%d", i);
				snprintf(d->ibdev_path, sizeof(d->ibdev_path), "/sys/class/infiniband/%s", de.name);
				devs[i].index = i;
				devs[i].guid = de.guid;
			}
			if (devs)
				ndevs = n;
		}
	}
	list = calloc(ndevs + 1, sizeof(*list));
	if (!list) {
		pthread_mutex_unlock(&devs_lock);
		errno = ENOMEM;
		return NULL;
	}
	for (i = 0; i < ndevs; i++)
		list[i] = &devs[i].dev;
	if (num)
		*num = ndevs;
	pthread_mutex_unlock(&devs_lock);
	return list;
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

EXPORT const char *ibv_get_device_name(struct ibv_device *d)
{
	return d ? d->name : NULL;
}

EXPORT __be64 ibv_get_device_guid(struct ibv_device *d)
{
	return htobe64(((struct sr_device *)d)->guid);
}

EXPORT int ibv_get_device_index(struct ibv_device *d)
{
	return ((struct sr_device *)d)->index;
}

static int sr_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *attr, size_t len);
static int sr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int sr_req_notify_cq(struct ibv_cq *cq, int solicited);
static int sr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int sr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static struct ibv_qp *sr_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a);
static struct ibv_cq_ex *sr_create_cq_ex(struct ibv_context *c, struct ibv_cq_init_attr_ex *a);
static int sr_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			      struct ibv_device_attr_ex *attr, size_t size);

/* verbs_ud.c: address handles, SRQs, UD sends. */
static int sr_post_srq_recv(struct ibv_srq *s, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
static uint32_t sr_srq_handle(struct ibv_srq *s);
static void sr_ud_wqe(struct sr_qp *q, const struct ibv_send_wr *wr, struct sr_send_wqe *w);
static struct ibv_srq *sr_srq_of_event(struct sr_context *x, uint32_t handle);
static void sr_wr_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey);
static void sr_wait_taken(uint8_t *map, uint32_t cons_off, uint32_t prod);
static void sr_srq_unreliable(struct ibv_srq *s);

/* ---- memory windows: allocated by the daemon, bound through the send ring ---- */

struct sr_mw {
	struct ibv_mw mw;
	uint32_t h;
};

static struct ibv_mw *sr_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type t)
{
	struct sr_alloc_mw q = { .pd = ((struct sr_pd *)pd)->h, .type = t };
	struct sr_mw_resp r;
	struct sr_mw *m;
	int e;

	if (t != IBV_MW_TYPE_1 && t != IBV_MW_TYPE_2) {
		errno = EINVAL;
		return NULL;
	}
	if (!(m = calloc(1, sizeof(*m)))) {
		errno = ENOMEM;
		return NULL;
	}
	if ((e = ctx_call(pd->context, SR_OP_ALLOC_MW, &q, sizeof(q), &r, sizeof(r), NULL))) {
		free(m);
		errno = e;
		return NULL;
	}
	m->mw.context = pd->context;
	m->mw.pd = pd;
	m->mw.rkey = r.rkey;
	m->mw.handle = r.handle;
	m->mw.type = t;
	m->h = r.handle;
	return &m->mw;
}

static int sr_dealloc_mw(struct ibv_mw *mw)
{
	struct sr_mw *m = (struct sr_mw *)mw;
	struct sr_handle q = { .handle = m->h };
	int e = ctx_call(mw->context, SR_OP_DEALLOC_MW, &q, sizeof(q), NULL, 0, NULL);

	if (!e)
		free(m);
	return e;
}

/* bind_wqe fills the BIND_MW fields of a send WQE (softroce_proto.h);
 * verb: posted by ibv_bind_mw rather than as a work request. */
static void bind_wqe(struct sr_send_wqe *w, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *b, bool verb)
{
	w->rkey = rkey;
	w->invalidate_rkey = mw ? mw->rkey : 0;
	w->remote_addr = b->addr;
	w->compare_add = b->length;
	w->swap = b->mw_access_flags;
	w->bind_lkey = b->mr ? b->mr->lkey : 0;
	w->bind_mw = verb && mw ? ((struct sr_mw *)mw)->h : 0;
}

static void doorbell(struct sr_qp *q);

/* ibv_bind_mw (type 1; verbs.h checked the type and the PDs): one BIND_MW
 * WQE in the send ring, in order with the QP's other sends. The window
 * takes its new key now, as rxe's provider does. */
static int sr_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	struct sr_send_wqe w = { .wr_id = b->wr_id, .opcode = IBV_WR_BIND_MW, .send_flags = b->send_flags };
	uint32_t rkey = ibv_inc_rkey(mw->rkey);
	int e = 0;

	bind_wqe(&w, mw, rkey, &b->bind_info, true);
	pthread_spin_lock(&q->sq_lock);
	if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD && qp->state != IBV_QPS_ERR)
		e = EINVAL;
	else if (q->sq_prod - atomic_load_explicit(at32(q->map, SR_QP_SQ_CONS), memory_order_acquire) >= q->sq_size)
		e = ENOMEM;
	else {
		memcpy(q->sq + (size_t)(q->sq_prod & (q->sq_size - 1)) * q->sq_stride, &w, sizeof(w));
		q->sq_prod++;
		atomic_store_explicit(at32(q->map, SR_QP_SQ_PROD), q->sq_prod, memory_order_release);
		doorbell(q);
		mw->rkey = rkey;
	}
	pthread_spin_unlock(&q->sq_lock);
	return e;
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sr_device *d = (struct sr_device *)device;
	struct sr_handle req = { .handle = d->index };
	struct sr_context *x;
	int sock, e, fds[2] = { -1, -1 };
	char dummy;

	sock = sr_connect();
	if (sock < 0) {
		errno = ENODEV;
		return NULL;
	}
	e = sr_call_v(sock, SR_OP_OPEN, &req, sizeof(req), NULL, 0, &dummy, 0, false, NULL, fds, 2);
	if (e) {
		close(sock);
		errno = e;
		return NULL;
	}
	x = calloc(1, sizeof(*x));
	if (!x) {
		close(sock);
		close(fds[0]);
		close(fds[1]);
		errno = ENOMEM;
		return NULL;
	}
	x->sock = sock;
	x->bell = fds[0];
	pthread_mutex_init(&x->lock, NULL);
	pthread_mutex_init(&x->cqs_lock, NULL);
	x->vctx.sz = sizeof(struct verbs_context);
	x->vctx.query_port = sr_query_port;
	x->vctx.create_qp_ex = sr_create_qp_ex;
	x->vctx.create_cq_ex = sr_create_cq_ex;
	x->vctx.query_device_ex = sr_query_device_ex;
	struct ibv_context *c = &x->vctx.context;
	c->device = device;
	c->cmd_fd = sock;
	c->async_fd = fds[1]; /* the daemon's async event pipe */
	c->num_comp_vectors = 1;
	pthread_mutex_init(&c->mutex, NULL);
	c->abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->ops.poll_cq = sr_poll_cq;
	c->ops.req_notify_cq = sr_req_notify_cq;
	c->ops.post_send = sr_post_send;
	c->ops.post_recv = sr_post_recv;
	c->ops.post_srq_recv = sr_post_srq_recv;
	c->ops.alloc_mw = sr_alloc_mw;
	c->ops.bind_mw = sr_bind_mw;
	c->ops.dealloc_mw = sr_dealloc_mw;
	return c;
}

EXPORT int ibv_close_device(struct ibv_context *c)
{
	struct sr_context *x = to_ctx(c);

	/* The daemon frees what is left when the connection closes. */
	close(x->sock);
	close(x->bell);
	if (c->async_fd >= 0)
		close(c->async_fd);
	free(x);
	return 0;
}

EXPORT int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	struct sr_dev_attr r;
	int e = ctx_call(c, SR_OP_QUERY_DEVICE, NULL, 0, &r, sizeof(r), NULL);

	if (e)
		return e;
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "softroce");
	a->node_guid = htobe64(r.node_guid);
	a->sys_image_guid = htobe64(r.node_guid);
	a->max_mr_size = r.max_mr_size;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = r.vendor_id;
	a->vendor_part_id = r.vendor_part_id;
	a->hw_ver = r.hw_ver;
	a->max_qp = r.max_qp;
	a->max_qp_wr = r.max_qp_wr;
	a->device_cap_flags = r.device_cap_flags;
	a->max_sge = r.max_sge;
	a->max_sge_rd = r.max_sge;
	a->max_cq = r.max_cq;
	a->max_cqe = r.max_cqe;
	a->max_mr = r.max_mr;
	a->max_pd = r.max_pd;
	a->max_qp_rd_atom = r.max_qp_rd_atom;
	a->max_qp_init_rd_atom = r.max_qp_init_rd_atom;
	a->max_res_rd_atom = r.max_qp_rd_atom * r.max_qp;
	a->atomic_cap = r.atomic_cap;
	a->max_srq = r.max_srq;
	a->max_srq_wr = r.max_srq_wr;
	a->max_srq_sge = r.max_srq_sge;
	a->max_mw = r.max_mw;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = r.phys_port_cnt;
	return 0;
}

static int port_attr(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	struct sr_handle req = { .handle = port };
	struct sr_port_attr r;
	int e = ctx_call(c, SR_OP_QUERY_PORT, &req, sizeof(req), &r, sizeof(r), NULL);

	if (e)
		return e;
	memset(a, 0, sizeof(*a));
	a->state = r.state;
	a->max_mtu = r.max_mtu;
	a->active_mtu = r.active_mtu;
	a->gid_tbl_len = r.gid_tbl_len;
	a->port_cap_flags = IBV_PORT_CM_SUP;
	a->max_msg_sz = r.max_msg_sz;
	a->pkey_tbl_len = r.pkey_tbl_len;
	a->max_vl_num = 1;
	a->active_width = 1; /* 1X */
	a->active_speed = 1; /* SDR, as rxe reports */
	a->phys_state = 5; /* LinkUp */
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static int sr_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	struct ibv_port_attr a;
	int e = port_attr(c, port, &a);

	if (e)
		return e;
	memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

/* The exported symbol serves binaries that do not use the inline path;
 * they pass the struct as it was before port_cap_flags2 existed. */
#undef ibv_query_port
#define ibv_query_port sr_impl_ibv_query_port
EXPORT int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *attr)
{
	return sr_query_port(c, port, (struct ibv_port_attr *)attr, offsetof(struct ibv_port_attr, port_cap_flags2));
}

static int gid(struct ibv_context *c, uint32_t port, uint32_t index, struct sr_gid *r)
{
	struct sr_gid_req req = { .port = port, .index = index };
	return ctx_call(c, SR_OP_QUERY_GID, &req, sizeof(req), r, sizeof(*r), NULL);
}

EXPORT int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *g)
{
	struct sr_gid r;
	int e;

	if (index < 0)
		return -1;
	e = gid(c, port, index, &r);
	if (e) {
		errno = e;
		return -1;
	}
	memcpy(g->raw, r.raw, 16);
	return 0;
}

EXPORT int ibv_query_gid_type(struct ibv_context *c, uint8_t port, unsigned int index, int *type)
{
	struct sr_gid r;
	int e = gid(c, port, index, &r);

	if (e) {
		errno = e;
		return -1;
	}
	*type = 1; /* IBV_GID_TYPE_SYSFS_ROCE_V2 */
	return 0;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
			     uint32_t flags, size_t size)
{
	struct ibv_gid_entry en = { 0 };
	struct sr_gid r;
	int e;

	if (flags)
		return EINVAL;
	e = gid(c, port, index, &r);
	if (e)
		return e == EINVAL ? ENODATA : e;
	memcpy(en.gid.raw, r.raw, 16);
	en.gid_index = index;
	en.port_num = port;
	en.gid_type = IBV_GID_TYPE_ROCE_V2;
	memcpy(entry, &en, size < sizeof(en) ? size : sizeof(en));
	return 0;
}

EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *entries, size_t max, uint32_t flags,
				    size_t size)
{
	struct ibv_port_attr pa;
	size_t n = 0;
	int e, i;

	if (flags)
		return -EINVAL;
	if ((e = port_attr(c, 1, &pa)))
		return -e;
	for (i = 0; i < pa.gid_tbl_len && n < max; i++) {
		if (_ibv_query_gid_ex(c, 1, i, (struct ibv_gid_entry *)((char *)entries + n * size), 0, size) == 0)
			n++;
	}
	return n;
}

EXPORT int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey)
{
	(void)c;
	if (port != 1 || index != 0)
		return -1;
	*pkey = htobe16(0xffff);
	return 0;
}

EXPORT int ibv_get_pkey_index(struct ibv_context *c, uint8_t port, __be16 pkey)
{
	(void)c;
	return port == 1 && be16toh(pkey) == 0xffff ? 0 : -1;
}

/* ---- PD ---- */

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *c)
{
	struct sr_handle r;
	struct sr_pd *p;
	int e = ctx_call(c, SR_OP_ALLOC_PD, NULL, 0, &r, sizeof(r), NULL);

	if (e) {
		errno = e;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		struct sr_handle q = { .handle = r.handle };
		ctx_call(c, SR_OP_DEALLOC_PD, &q, sizeof(q), NULL, 0, NULL);
		errno = ENOMEM;
		return NULL;
	}
	p->pd.context = c;
	p->pd.handle = r.handle;
	p->h = r.handle;
	return &p->pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct sr_pd *p = (struct sr_pd *)pd;
	struct sr_handle q = { .handle = p->h };
	int e = ctx_call(pd->context, SR_OP_DEALLOC_PD, &q, sizeof(q), NULL, 0, NULL);

	if (!e)
		free(p);
	return e;
}

/* ---- registered memory: moved into memfds (see docs/abi.md) ---- */

/* An extent is a page range of the process moved into one of our memfds
 * (the memfd's offset 0 is start). MRs that share pages share the extent
 * (refcounted); each MR holds its extents, so its dereg drops exactly
 * those. An extent is listed while new registrations may reuse it. Once
 * the program has unmapped or replaced pages of it (a buffer freed while
 * registered, and new memory mapped at its addresses), it is unlisted:
 * it lives on for the MRs that hold it, as pinned pages outlive their
 * mapping in the kernel, and registrations of the new memory move it
 * into a memfd of its own. */
struct extent {
	uintptr_t start, end;
	int fd;
	unsigned long ino; /* the memfd's inode, as /proc/self/maps shows it */
	int refs;
	bool listed;
	struct extent *next;
};

static pthread_mutex_t ext_lock = PTHREAD_MUTEX_INITIALIZER;
static struct extent *extents; /* listed and unlisted */

/* A line of /proc/self/maps. */
struct mapent {
	uintptr_t s, e;
	unsigned long off, ino;
	char perms[8];
	bool ours; /* one of our memfds */
	bool other; /* a mapping check_maps refuses */
};

/* read_maps returns the mappings overlapping [lo, hi), in address order,
 * in *out, or -1 when /proc/self/maps cannot be read; free the list with
 * free_maps. It allocates with mmap, never malloc: after fork the child
 * reads its maps while registered heap pages are still shared with the
 * parent, where a malloc would write into the parent's heap. */
static int read_maps(uintptr_t lo, uintptr_t hi, struct mapent **out)
{
	char buf[4096], line[512];
	size_t cap = 0, len = 0;
	struct mapent *v = NULL;
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC), n = 0;
	ssize_t k;

	*out = NULL;
	if (fd < 0)
		return -1;
	while ((k = read(fd, buf, sizeof(buf))) > 0 || (k < 0 && errno == EINTR)) {
		for (ssize_t i = 0; i < k; i++) {
			if (buf[i] != '\n') {
				if (len < sizeof(line) - 1)
					line[len++] = buf[i];
				continue;
			}
			line[len] = 0;
			len = 0;
			/* start-end perms offset dev inode path */
			struct mapent m = { 0 };
			char *p = line, *q;
			m.s = strtoul(p, &q, 16);
			if (*q != '-')
				continue;
			m.e = strtoul(q + 1, &p, 16);
			if (m.e <= lo || m.s >= hi)
				continue;
			while (*p == ' ')
				p++;
			for (int j = 0; j < 4 && *p && *p != ' '; j++)
				m.perms[j] = *p++;
			m.off = strtoul(p, &p, 16);
			while (*p == ' ')
				p++;
			while (*p && *p != ' ')
				p++; /* dev */
			m.ino = strtoul(p, &p, 10);
			while (*p == ' ')
				p++;
			m.ours = strstr(p, "memfd:softroce-mr") != NULL;
			m.other = !m.ours && (m.perms[0] != 'r' || m.perms[1] != 'w' || m.perms[3] == 's' || strstr(p, "huge"));
			if ((size_t)n == cap) {
				size_t ncap = cap ? 2 * cap : 4096 / sizeof(*v);
				void *w = v ? mremap(v, cap * sizeof(*v), ncap * sizeof(*v), MREMAP_MAYMOVE)
					    : mmap(NULL, ncap * sizeof(*v), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
				if (w == MAP_FAILED) {
					if (v)
						munmap(v, cap * sizeof(*v));
					close(fd);
					return -1;
				}
				v = w;
				cap = ncap;
			}
			v[n++] = m;
		}
		if (k < 0)
			k = 0;
	}
	close(fd);
	if (k < 0) {
		if (v)
			munmap(v, cap * sizeof(*v));
		return -1;
	}
	*out = v;
	return n;
}

/* free_maps frees read_maps' list of n entries. */
static void free_maps(struct mapent *m, int n)
{
	if (m) {
		size_t cap = 4096 / sizeof(*m);
		while (cap < (size_t)n)
			cap *= 2;
		munmap(m, cap * sizeof(*m));
	}
}

/* check_maps refuses ranges the memfd route cannot move: shared file
 * mappings (writes would stop reaching the file), read-only memory and
 * huge pages. */
static int check_maps(const struct mapent *m, int n)
{
	for (int i = 0; i < n; i++)
		if (m[i].other)
			return EOPNOTSUPP;
	return 0;
}

/* mapped_from reports whether every page of [lo, hi) is mapped from x's
 * memfd at x's offsets. */
static bool mapped_from(const struct extent *x, const struct mapent *m, int n, uintptr_t lo, uintptr_t hi)
{
	uintptr_t covered = lo;

	for (int i = 0; i < n && covered < hi; i++) {
		if (m[i].e <= covered)
			continue;
		if (m[i].s > covered || !m[i].ours || m[i].ino != x->ino || m[i].s < x->start ||
		    m[i].off != m[i].s - x->start)
			return false;
		covered = m[i].e;
	}
	return covered >= hi;
}

/* What the mover copies and maps, read by the child below. */
struct move {
	uintptr_t s;
	size_t n;
	int fd;
	int err; /* written by the child only after the remap, or on failure before it */
};

/*
 * move_child copies the range into the memfd and maps the memfd over it.
 * It runs on its own stack while the calling thread is suspended
 * (CLONE_VM | CLONE_VFORK), because the range may hold that thread's own
 * stack: any write the caller made to it between the copy and the remap
 * would be lost. Raw system calls only: the child shares the caller's TLS.
 */
static int move_child(void *p)
{
	struct move *m = p;
	uintptr_t s = m->s;
	size_t n = m->n, off = 0;
	int fd = m->fd;

	while (off < n) {
		long w = syscall(SYS_pwrite64, fd, (void *)(s + off), n - off, off);
		if (w <= 0) {
			m->err = w < 0 ? errno : EIO; /* no remap happened: the write lands */
			return 1;
		}
		off += w;
	}
	long r = syscall(SYS_mmap, (void *)s, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	if (r == -1) {
		m->err = errno;
		return 1;
	}
	m->err = 0; /* into the memfd page now, which the caller sees */
	return 0;
}

static struct extent *move_pages(uintptr_t s, uintptr_t e)
{
	const size_t stack = 64 * 1024;
	struct move m = { .s = s, .n = e - s, .err = -1 };
	struct extent *x = calloc(1, sizeof(*x));
	void *st = MAP_FAILED;
	struct stat sb;
	int fd = -1;
	pid_t pid;

	if (!x)
		goto fail;
	fd = memfd_create("softroce-mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, m.n) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0 ||
	    fstat(fd, &sb) < 0)
		goto fail;
	m.fd = fd;
	st = mmap(NULL, stack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (st == MAP_FAILED)
		goto fail;
	/* Other threads writing the range between the copy and the remap
	 * lose their writes (docs/abi.md); this thread is suspended. */
	pid = clone(move_child, (char *)st + stack, CLONE_VM | CLONE_VFORK, &m);
	if (pid < 0)
		goto fail;
	while (waitpid(pid, NULL, __WCLONE) < 0 && errno == EINTR)
		;
	munmap(st, stack);
	st = MAP_FAILED;
	if (m.err) {
		errno = m.err > 0 ? m.err : EIO;
		goto fail;
	}
	x->start = s;
	x->end = e;
	x->fd = fd;
	x->ino = sb.st_ino;
	x->listed = true;
	x->next = extents;
	extents = x;
	return x;
fail:
	if (st != MAP_FAILED)
		munmap(st, stack);
	if (fd >= 0)
		close(fd);
	free(x);
	return NULL;
}

/*
 * A range still mapped from a memfd becomes private anonymous memory
 * again, with its contents: at the last dereg of its extent (so that fork
 * copies it again), and after fork in the child, where the pages would
 * otherwise be shared with the parent while Linux gives a child a private
 * copy of pinned pages. The remap runs from a CLONE_VFORK child on its own
 * stack in case the range holds the thread's stack.
 */
struct run {
	uintptr_t s, e;
	int fd;
	unsigned long off; /* of s in fd */
};

struct privatize {
	const struct run *runs;
	int n;
};

static int privatize_child(void *p)
{
	struct privatize *v = p;
	for (int i = 0; i < v->n; i++) {
		const struct run *r = &v->runs[i];
		size_t n = r->e - r->s;
		long t = syscall(SYS_mmap, NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (t == -1)
			continue; /* out of memory: this range stays shared */
		/* The memfd holds the range's bytes: read them from it (whole
		 * pages, so not through the program's own view of them). */
		size_t off = 0;
		while (off < n) {
			long k = syscall(SYS_pread64, r->fd, (void *)(t + off), n - off, r->off + off);
			if (k <= 0)
				break;
			off += k;
		}
		if (off < n || syscall(SYS_mremap, t, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, r->s) == -1)
			syscall(SYS_munmap, t, n);
	}
	return 0;
}

/* privatize makes what is still mapped from x's memfd at x's offsets
 * private anonymous memory; pages the program has unmapped or replaced
 * since are left alone, whatever is there now. No malloc (see
 * read_maps). */
static void privatize(const struct extent *x)
{
	const size_t stack = 64 * 1024;
	struct run runs[32];
	struct privatize v = { .runs = runs };
	struct mapent *m;
	int n = read_maps(x->start, x->end, &m);
	void *st = MAP_FAILED;

	for (int i = 0; i <= n; i++) {
		if (i < n && m[i].ours && m[i].ino == x->ino && m[i].s >= x->start && m[i].off == m[i].s - x->start) {
			runs[v.n].s = m[i].s;
			runs[v.n].e = m[i].e < x->end ? m[i].e : x->end;
			runs[v.n].fd = x->fd;
			runs[v.n].off = m[i].off;
			v.n++;
		}
		if (!v.n || (i < n && v.n < (int)(sizeof(runs) / sizeof(runs[0]))))
			continue;
		if (st == MAP_FAILED)
			st = mmap(NULL, stack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
		if (st == MAP_FAILED)
			break;
		pid_t pid = clone(privatize_child, (char *)st + stack, CLONE_VM | CLONE_VFORK, &v);
		if (pid > 0)
			while (waitpid(pid, NULL, __WCLONE) < 0 && errno == EINTR)
				;
		v.n = 0;
	}
	if (st != MAP_FAILED)
		munmap(st, stack);
	free_maps(m, n);
}

/* After fork the child's context is not usable (as with rdma-core): it
 * forgets every extent, keeping private copies of their pages. Every
 * range is private before anything is freed: a heap page may be one of
 * them, shared with the parent until then. */
static void atfork_child(void)
{
	for (struct extent *x = extents; x; x = x->next)
		privatize(x);
	for (struct extent *x = extents, *n; x; x = n) {
		n = x->next;
		close(x->fd);
		free(x);
	}
	extents = NULL;
	pthread_mutex_init(&ext_lock, NULL);
}

__attribute__((constructor)) static void sr_init(void)
{
	pthread_atfork(NULL, NULL, atfork_child);
}

static struct extent *find_extent(uintptr_t a)
{
	for (struct extent *x = extents; x; x = x->next)
		if (x->listed && a >= x->start && a < x->end)
			return x;
	return NULL;
}

/* put_extent drops a reference; the last one makes the pages private
 * memory again. */
static void put_extent(struct extent *x)
{
	if (--x->refs)
		return;
	struct extent **pp = &extents;
	while (*pp != x)
		pp = &(*pp)->next;
	*pp = x->next;
	privatize(x);
	close(x->fd);
	free(x);
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	struct {
		struct sr_reg_mr_iova h;
		struct sr_extent e[SR_MAX_EXTENTS];
	} req;
	int fds[SR_MAX_EXTENTS];
	struct extent *used[SR_MAX_EXTENTS];
	struct mapent *maps;
	uintptr_t ps, pe, a;
	struct sr_mr *m;
	struct sr_mr_resp r;
	int n = 0, e, nmaps;

	if (!length || (uintptr_t)addr + length < (uintptr_t)addr) {
		errno = EINVAL;
		return NULL;
	}
	if (iova + length < iova) {
		errno = EINVAL;
		return NULL;
	}
	ps = (uintptr_t)addr & ~(uintptr_t)(SR_PAGE - 1);
	pe = ((uintptr_t)addr + length + SR_PAGE - 1) & ~(uintptr_t)(SR_PAGE - 1);
	pthread_mutex_lock(&ext_lock);
	nmaps = read_maps(ps, pe, &maps);
	if ((e = check_maps(maps, nmaps))) {
		if (getenv("SOFTROCE_DEBUG"))
			fprintf(stderr, "softroce: cannot register %lx-%lx: a shared, read-only or huge-page mapping\n",
				(unsigned long)ps, (unsigned long)pe);
		goto out;
	}
	/* Extents whose pages in the range are no longer mapped from them
	 * (freed while registered, new memory there now) are not reused:
	 * that memory gets a memfd of its own. */
	for (struct extent *x = extents; x && nmaps >= 0; x = x->next) {
		if (!x->listed || x->end <= ps || x->start >= pe)
			continue;
		if (!mapped_from(x, maps, nmaps, x->start > ps ? x->start : ps, x->end < pe ? x->end : pe))
			x->listed = false;
	}
	/* Tile the range with the extents already moved and new ones. */
	for (a = ps; a < pe && n < SR_MAX_EXTENTS;) {
		struct extent *x = find_extent(a);
		if (!x) {
			uintptr_t end = pe;
			for (struct extent *y = extents; y; y = y->next)
				if (y->listed && y->start > a && y->start < end)
					end = y->start;
			x = move_pages(a, end);
			if (!x) {
				e = errno ? errno : ENOMEM;
				goto undo;
			}
		}
		uintptr_t end = x->end < pe ? x->end : pe;
		req.e[n].va = a;
		req.e[n].len = end - a;
		req.e[n].off = a - x->start;
		fds[n] = x->fd;
		used[n] = x;
		x->refs++;
		n++;
		a = end;
	}
	if (a < pe) {
		e = ENOMEM;
		goto undo;
	}
	req.h.h.pd = ((struct sr_pd *)pd)->h;
	req.h.h.access = access;
	req.h.h.addr = (uintptr_t)addr;
	req.h.h.length = length;
	req.h.h.nextent = n;
	req.h.h.reserved = 0;
	req.h.iova = iova; /* the region's VA for peers and SGEs: ibv_reg_mr's is addr */
	{
		struct sr_context *x = to_ctx(pd->context);
		pthread_mutex_lock(&x->lock);
		e = sr_call_v(x->sock, SR_OP_REG_MR_IOVA, &req, sizeof(req.h) + n * sizeof(req.e[0]), fds, n, &r, 16, false,
			      NULL, NULL, 0);
		pthread_mutex_unlock(&x->lock);
	}
	if (e)
		goto undo;
	m = calloc(1, sizeof(*m));
	if (!m || !(m->ext = malloc(n * sizeof(*m->ext)))) {
		free(m);
		e = ENOMEM;
		goto undo; /* the daemon frees the MR with the connection */
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.handle = r.handle;
	m->mr.lkey = r.lkey;
	m->mr.rkey = r.rkey;
	m->h = r.handle;
	memcpy(m->ext, used, n * sizeof(*used));
	m->next = n;
	free_maps(maps, nmaps);
	pthread_mutex_unlock(&ext_lock);
	return &m->mr;
undo:
	/* Each extent in used got one reference above: drop them. */
	while (n > 0)
		put_extent(used[--n]);
out:
	free_maps(maps, nmaps);
	pthread_mutex_unlock(&ext_lock);
	errno = e;
	return NULL;
}

#undef ibv_reg_mr
#define ibv_reg_mr sr_impl_ibv_reg_mr
EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_mr(pd, addr, length, (uintptr_t)addr, access);
}

#undef ibv_reg_mr_iova
EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	return reg_mr(pd, addr, length, iova, access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct sr_mr *m = (struct sr_mr *)mr;
	struct sr_handle q = { .handle = m->h };
	int e = ctx_call(mr->context, SR_OP_DEREG_MR, &q, sizeof(q), NULL, 0, NULL);

	if (e)
		return e;
	pthread_mutex_lock(&ext_lock);
	for (int i = 0; i < m->next; i++)
		put_extent(m->ext[i]);
	pthread_mutex_unlock(&ext_lock);
	free(m->ext);
	free(m);
	return 0;
}

/* ---- completion channels and CQs ---- */

EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *c)
{
	struct sr_handle r;
	struct sr_channel *ch;
	int fd = -1;
	int e = ctx_call(c, SR_OP_CREATE_CHANNEL, NULL, 0, &r, sizeof(r), &fd);

	if (e) {
		errno = e;
		return NULL;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch) {
		close(fd);
		errno = ENOMEM;
		return NULL;
	}
	ch->ch.context = c;
	ch->ch.fd = fd;
	ch->h = r.handle;
	return &ch->ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct sr_channel *ch = (struct sr_channel *)channel;
	struct sr_handle q = { .handle = ch->h };
	int e = ctx_call(channel->context, SR_OP_DESTROY_CHANNEL, &q, sizeof(q), NULL, 0, NULL);

	if (e)
		return e;
	close(channel->fd);
	free(ch);
	return 0;
}

EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context, struct ibv_comp_channel *channel,
				    int comp_vector)
{
	struct sr_create_cq req = { .cqe = cqe > 0 ? cqe : 0 };
	struct sr_context *x = to_ctx(c);
	struct sr_cq *q;
	int fd = -1, e;
	void *map;

	(void)comp_vector;
	if (cqe <= 0) {
		errno = EINVAL;
		return NULL;
	}
	if (channel)
		req.channel = ((struct sr_channel *)channel)->h;
	struct sr_cq_resp r;
	e = ctx_call(c, SR_OP_CREATE_CQ, &req, sizeof(req), &r, sizeof(r), &fd);
	if (e) {
		errno = e;
		return NULL;
	}
	map = mmap(NULL, r.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	q = calloc(1, sizeof(*q));
	if (map == MAP_FAILED || !q || r.map_len < SR_PAGE + (uint64_t)r.size * SR_CQE_SIZE) {
		struct sr_handle d = { .handle = r.handle };
		ctx_call(c, SR_OP_DESTROY_CQ, &d, sizeof(d), NULL, 0, NULL);
		if (map != MAP_FAILED)
			munmap(map, r.map_len);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->cq.context = c;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.handle = r.handle;
	q->cq.cqe = r.size;
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	q->h = r.handle;
	q->map = map;
	q->len = r.map_len;
	q->size = r.size;
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
	pthread_mutex_lock(&x->cqs_lock);
	q->next = x->cqs;
	x->cqs = q;
	pthread_mutex_unlock(&x->cqs_lock);
	return &q->cq;
}

EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct sr_cq *q = (struct sr_cq *)cq;
	struct sr_context *x = to_ctx(cq->context);
	struct sr_handle d = { .handle = q->h };
	int e = ctx_call(cq->context, SR_OP_DESTROY_CQ, &d, sizeof(d), NULL, 0, NULL);

	if (e)
		return e;
	pthread_mutex_lock(&x->cqs_lock);
	for (struct sr_cq **pp = &x->cqs; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&x->cqs_lock);
	munmap(q->map, q->len);
	free(q);
	return 0;
}

/* The daemon sends a new ring holding the old one's completions at the
 * same indices, so q->cons stays valid: the ring is swapped under q->lock,
 * and a poll of the old ring meanwhile only reads completions the new one
 * holds too. An arm made during the call is carried over; a program
 * should still not poll or arm the CQ from another thread meanwhile
 * (libibverbs promises nothing there either). */
EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	struct sr_cq *q = (struct sr_cq *)cq;
	struct sr_resize_cq req = { .handle = q->h, .cqe = cqe > 0 ? cqe : 0 };
	struct sr_cq_resp r;
	uint8_t *old;
	size_t oldlen;
	uint32_t armed;
	int fd = -1, e;
	void *map;

	if (cqe <= 0)
		return EINVAL;
	e = ctx_call(cq->context, SR_OP_RESIZE_CQ, &req, sizeof(req), &r, sizeof(r), &fd);
	if (e)
		return e;
	map = mmap(NULL, r.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return ENOMEM;
	if (r.size == 0 || (r.size & (r.size - 1)) || r.map_len < SR_PAGE + (uint64_t)r.size * SR_CQE_SIZE) {
		munmap(map, r.map_len);
		return EPROTO;
	}
	pthread_spin_lock(&q->lock);
	old = q->map;
	oldlen = q->len;
	armed = atomic_exchange(at32(old, SR_CQ_ARMED), 0);
	if (armed)
		atomic_store(at32(map, SR_CQ_ARMED), armed);
	q->map = map;
	q->len = r.map_len;
	q->size = r.size;
	atomic_store_explicit(at32(q->map, SR_CQ_CONS), q->cons, memory_order_release);
	cq->cqe = r.size;
	pthread_spin_unlock(&q->lock);
	munmap(old, oldlen);
	return 0;
}

static int sr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct sr_cq *q = (struct sr_cq *)cq;
	uint32_t prod, k = 0;

	pthread_spin_lock(&q->lock);
	prod = atomic_load_explicit(at32(q->map, SR_CQ_PROD), memory_order_acquire);
	while (k < (uint32_t)n && q->cons != prod) {
		memcpy(&wc[k], q->map + SR_PAGE + (size_t)(q->cons & (q->size - 1)) * SR_CQE_SIZE, sizeof(*wc));
		q->cons++;
		k++;
	}
	if (k) {
		atomic_store_explicit(at32(q->map, SR_CQ_CONS), q->cons, memory_order_release);
		q->empty = 0;
	} else if (++q->empty >= SR_YIELD_AFTER) {
		/* A program spinning on an empty CQ keeps the CPU from the daemon
		 * that must produce the completion: yield now and then. */
		q->empty = 0;
		sched_yield();
	}
	pthread_spin_unlock(&q->lock);
	return k;
}

static int sr_req_notify_cq(struct ibv_cq *cq, int solicited)
{
	struct sr_cq *q = (struct sr_cq *)cq;

	if (!cq->channel)
		return EINVAL;
	atomic_store_explicit(at32(q->map, SR_CQ_ARMED), solicited ? 2 : 1, memory_order_seq_cst);
	return 0;
}

/* ---- the extended CQ (ibv_create_cq_ex): one CQE at a time from the ring ---- */

static inline struct sr_cq *to_cqx(struct ibv_cq_ex *x)
{
	return (struct sr_cq *)x;
}

/* cqx_load reads the CQE at cons into cur, or reports ENOENT. */
static int cqx_load(struct sr_cq *q)
{
	uint32_t prod = atomic_load_explicit(at32(q->map, SR_CQ_PROD), memory_order_acquire);

	q->cur_valid = false;
	if (q->cons == prod)
		return ENOENT;
	q->cur_valid = true;
	memcpy(&q->cur, q->map + SR_PAGE + (size_t)(q->cons & (q->size - 1)) * SR_CQE_SIZE, sizeof(q->cur));
	q->cqx.status = q->cur.status;
	q->cqx.wr_id = q->cur.wr_id;
	return 0;
}

static int cqx_start_poll(struct ibv_cq_ex *x, struct ibv_poll_cq_attr *attr)
{
	struct sr_cq *q = to_cqx(x);
	int e;

	if (attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&q->lock);
	if ((e = cqx_load(q))) {
		pthread_spin_unlock(&q->lock); /* ENOENT: no end_poll follows */
		if (++q->empty >= SR_YIELD_AFTER) {
			q->empty = 0;
			sched_yield();
		}
		return e;
	}
	q->empty = 0;
	return 0;
}

static int cqx_next_poll(struct ibv_cq_ex *x)
{
	struct sr_cq *q = to_cqx(x);

	q->cons++;
	return cqx_load(q);
}

static void cqx_end_poll(struct ibv_cq_ex *x)
{
	struct sr_cq *q = to_cqx(x);

	if (q->cur_valid) /* the CQE start_poll or next_poll returned last */
		q->cons++;
	q->cur_valid = false;
	atomic_store_explicit(at32(q->map, SR_CQ_CONS), q->cons, memory_order_release);
	pthread_spin_unlock(&q->lock);
}

static enum ibv_wc_opcode cqx_opcode(struct ibv_cq_ex *x) { return to_cqx(x)->cur.opcode; }
static uint32_t cqx_vendor_err(struct ibv_cq_ex *x) { return to_cqx(x)->cur.vendor_err; }
static uint32_t cqx_byte_len(struct ibv_cq_ex *x) { return to_cqx(x)->cur.byte_len; }
static __be32 cqx_imm_data(struct ibv_cq_ex *x) { return to_cqx(x)->cur.imm_data; }
static uint32_t cqx_qp_num(struct ibv_cq_ex *x) { return to_cqx(x)->cur.qp_num; }
static uint32_t cqx_src_qp(struct ibv_cq_ex *x) { return to_cqx(x)->cur.src_qp; }
static unsigned int cqx_wc_flags(struct ibv_cq_ex *x) { return to_cqx(x)->cur.wc_flags; }
static uint32_t cqx_slid(struct ibv_cq_ex *x) { return to_cqx(x)->cur.slid; }
static uint8_t cqx_sl(struct ibv_cq_ex *x) { return to_cqx(x)->cur.sl; }
static uint8_t cqx_dlid_path_bits(struct ibv_cq_ex *x) { return to_cqx(x)->cur.dlid_path_bits; }

static struct ibv_cq_ex *sr_create_cq_ex(struct ibv_context *c, struct ibv_cq_init_attr_ex *a)
{
	struct ibv_cq *cq;
	struct sr_cq *q;

	/* Timestamps, VLANs, flow tags, tag matching, CQ flags and parent
	 * domains are not there. */
	if ((a->wc_flags & ~(uint64_t)IBV_WC_STANDARD_FLAGS) || a->comp_mask) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	cq = ibv_create_cq(c, a->cqe, a->cq_context, a->channel, a->comp_vector);
	if (!cq)
		return NULL;
	q = (struct sr_cq *)cq;
	struct ibv_cq_ex *x = &q->cqx;
	x->start_poll = cqx_start_poll;
	x->next_poll = cqx_next_poll;
	x->end_poll = cqx_end_poll;
	x->read_opcode = cqx_opcode;
	x->read_vendor_err = cqx_vendor_err;
	x->read_byte_len = cqx_byte_len;
	x->read_imm_data = cqx_imm_data;
	x->read_qp_num = cqx_qp_num;
	x->read_src_qp = cqx_src_qp;
	x->read_wc_flags = cqx_wc_flags;
	x->read_slid = cqx_slid;
	x->read_sl = cqx_sl;
	x->read_dlid_path_bits = cqx_dlid_path_bits;
	return x;
}

static int sr_query_device_ex(struct ibv_context *c, const struct ibv_query_device_ex_input *in,
			      struct ibv_device_attr_ex *attr, size_t size)
{
	struct ibv_device_attr_ex a;
	int e;

	if (in && in->comp_mask)
		return EINVAL;
	if (size < sizeof(a.orig_attr))
		return EINVAL;
	memset(&a, 0, sizeof(a));
	if ((e = ibv_query_device(c, &a.orig_attr)))
		return e;
	/* Nothing beyond the classic attributes: no ODP, TSO, RSS,
	 * timestamps, packet pacing, tag matching or device memory. */
	a.max_dm_size = 0;
	memcpy(attr, &a, size < sizeof(a) ? size : sizeof(a));
	return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context)
{
	struct sr_context *x = to_ctx(channel->context);
	uint32_t h;
	ssize_t n;

	for (;;) {
		/* A signal ends the wait with EINTR, as rdma-core's read of the
		 * uverbs fd does: programs stop a timed loop by SIGALRM. */
		n = read(channel->fd, &h, sizeof(h));
		if (n != sizeof(h))
			return -1;
		pthread_mutex_lock(&x->cqs_lock);
		struct sr_cq *q;
		for (q = x->cqs; q && q->h != h; q = q->next)
			;
		pthread_mutex_unlock(&x->cqs_lock);
		if (!q)
			continue; /* an event for a CQ destroyed meanwhile */
		*cq = &q->cq;
		*cq_context = q->cq.cq_context;
		return 0;
	}
}

EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += n;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- QPs ---- */

static struct sr_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia);

EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	struct sr_qp *q = create_qp(pd, ia);
	return q ? &q->qp : NULL;
}

static struct sr_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	struct sr_create_qp req = { 0 };
	struct sr_qp_resp r;
	struct sr_qp *q;
	struct sr_context *x = to_ctx(pd->context);
	int fd = -1, e;
	void *map;

	if (!ia || !ia->send_cq || !ia->recv_cq) {
		errno = EINVAL;
		return NULL;
	}
	if (ia->qp_type != IBV_QPT_RC && ia->qp_type != IBV_QPT_UC && ia->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (ia->srq)
		req.srq = sr_srq_handle(ia->srq);
	if (ia->srq && ia->qp_type != IBV_QPT_RC)
		sr_srq_unreliable(ia->srq);
	req.pd = ((struct sr_pd *)pd)->h;
	req.send_cq = ((struct sr_cq *)ia->send_cq)->h;
	req.recv_cq = ((struct sr_cq *)ia->recv_cq)->h;
	req.qp_type = ia->qp_type;
	req.max_send_wr = ia->cap.max_send_wr;
	req.max_recv_wr = ia->cap.max_recv_wr;
	req.max_send_sge = ia->cap.max_send_sge;
	req.max_recv_sge = ia->cap.max_recv_sge;
	req.max_inline = ia->cap.max_inline_data;
	req.sq_sig_all = ia->sq_sig_all;
	e = ctx_call(pd->context, SR_OP_CREATE_QP, &req, sizeof(req), &r, sizeof(r), &fd);
	if (e) {
		errno = e;
		return NULL;
	}
	map = mmap(NULL, r.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	q = calloc(1, sizeof(*q));
	if (map == MAP_FAILED || !q || r.sq_off + (uint64_t)r.sq_size * r.sq_stride > r.map_len ||
	    r.rq_off + (uint64_t)r.rq_size * r.rq_stride > r.map_len) {
		struct sr_handle d = { .handle = r.handle };
		ctx_call(pd->context, SR_OP_DESTROY_QP, &d, sizeof(d), NULL, 0, NULL);
		if (map != MAP_FAILED)
			munmap(map, r.map_len);
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.qp_context = ia->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = ia->send_cq;
	q->qp.recv_cq = ia->recv_cq;
	q->qp.srq = ia->srq;
	q->qp.handle = r.handle;
	q->qp.qp_num = r.qpn;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = ia->qp_type;
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->h = r.handle;
	q->token = r.token;
	q->map = map;
	q->len = r.map_len;
	q->sq_size = r.sq_size;
	q->rq_size = r.rq_size;
	q->sq_stride = r.sq_stride;
	q->rq_stride = r.rq_stride;
	q->sq = (uint8_t *)map + r.sq_off;
	q->rq = (uint8_t *)map + r.rq_off;
	q->max_send_sge = r.max_send_sge;
	q->max_recv_sge = r.max_recv_sge;
	q->max_inline = r.max_inline;
	q->bell = x->bell;
	pthread_spin_init(&q->sq_lock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&q->rq_lock, PTHREAD_PROCESS_PRIVATE);
	q->cap.max_send_wr = r.max_send_wr;
	q->cap.max_recv_wr = r.max_recv_wr;
	q->cap.max_send_sge = r.max_send_sge;
	q->cap.max_recv_sge = r.max_recv_sge;
	q->cap.max_inline_data = r.max_inline;
	ia->cap = q->cap;
	pthread_mutex_lock(&x->cqs_lock);
	q->next = x->qps;
	x->qps = q;
	pthread_mutex_unlock(&x->cqs_lock);
	return q;
}

static void doorbell(struct sr_qp *q)
{
	/* The store of the producer index and this load are ordered (the
	 * daemon does the mirror image), so either it sees the WQE or we see
	 * that it sleeps. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(at32(q->map, SR_QP_SLEEPING), memory_order_relaxed)) {
		uint64_t one = 1;
		ssize_t w = write(q->bell, &one, sizeof(one));
		(void)w;
	}
}

static int sr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	uint32_t cons;
	int e = 0, posted = 0;

	pthread_spin_lock(&q->sq_lock);
	if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_SQD && qp->state != IBV_QPS_ERR) {
		e = EINVAL;
		*bad = wr;
		goto out;
	}
	cons = atomic_load_explicit(at32(q->map, SR_QP_SQ_CONS), memory_order_acquire);
	for (; wr; wr = wr->next) {
		uint8_t *slot;
		struct sr_send_wqe w = { 0 };
		if (q->sq_prod - cons >= q->sq_size) {
			e = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_send_sge) {
			e = EINVAL;
			break;
		}
		slot = q->sq + (size_t)(q->sq_prod & (q->sq_size - 1)) * q->sq_stride;
		w.wr_id = wr->wr_id;
		w.opcode = wr->opcode;
		w.send_flags = wr->send_flags;
		memcpy(w.imm_data, &wr->imm_data, 4);
		if (wr->opcode == IBV_WR_SEND_WITH_INV || wr->opcode == IBV_WR_LOCAL_INV)
			w.invalidate_rkey = wr->invalidate_rkey;
		switch (wr->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			w.remote_addr = wr->wr.rdma.remote_addr;
			w.rkey = wr->wr.rdma.rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w.remote_addr = wr->wr.atomic.remote_addr;
			w.rkey = wr->wr.atomic.rkey;
			w.compare_add = wr->wr.atomic.compare_add;
			w.swap = wr->wr.atomic.swap;
			break;
		case IBV_WR_BIND_MW:
			bind_wqe(&w, wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info, false);
			break;
		default:
			break;
		}
		if (qp->qp_type == IBV_QPT_UD)
			sr_ud_wqe(q, wr, &w);
		if (wr->send_flags & IBV_SEND_INLINE) {
			size_t len = 0;
			for (int i = 0; i < wr->num_sge; i++)
				len += wr->sg_list[i].length;
			if (len > q->max_inline) {
				e = EINVAL;
				break;
			}
			uint8_t *p = slot + sizeof(w);
			for (int i = 0; i < wr->num_sge; i++) {
				memcpy(p, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
				p += wr->sg_list[i].length;
			}
			w.inline_len = len;
		} else {
			w.num_sge = wr->num_sge;
			for (int i = 0; i < wr->num_sge; i++) {
				struct sr_sge s = { wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey };
				memcpy(slot + sizeof(w) + i * sizeof(s), &s, sizeof(s));
			}
		}
		memcpy(slot, &w, sizeof(w));
		q->sq_prod++;
		posted++;
	}
	if (e)
		*bad = wr;
	if (posted) {
		atomic_store_explicit(at32(q->map, SR_QP_SQ_PROD), q->sq_prod, memory_order_release);
		doorbell(q);
	}
out:
	pthread_spin_unlock(&q->sq_lock);
	return e;
}

static int sr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	uint32_t cons;
	int e = 0, posted = 0;

	pthread_spin_lock(&q->rq_lock);
	if (qp->state == IBV_QPS_RESET || qp->srq) { /* a QP on an SRQ has no receive queue */
		e = EINVAL;
		*bad = wr;
		goto out;
	}
	cons = atomic_load_explicit(at32(q->map, SR_QP_RQ_CONS), memory_order_acquire);
	for (; wr; wr = wr->next) {
		uint8_t *slot;
		struct sr_recv_wqe w = { 0 };
		if (q->rq_prod - cons >= q->rq_size) {
			e = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_recv_sge) {
			e = EINVAL;
			break;
		}
		slot = q->rq + (size_t)(q->rq_prod & (q->rq_size - 1)) * q->rq_stride;
		w.wr_id = wr->wr_id;
		w.num_sge = wr->num_sge;
		for (int i = 0; i < wr->num_sge; i++) {
			struct sr_sge s = { wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey };
			memcpy(slot + sizeof(w) + i * sizeof(s), &s, sizeof(s));
		}
		memcpy(slot, &w, sizeof(w));
		q->rq_prod++;
		posted++;
	}
	if (e)
		*bad = wr;
	if (posted) {
		atomic_store_explicit(at32(q->map, SR_QP_RQ_PROD), q->rq_prod, memory_order_release);
		doorbell(q);
	}
out:;
	uint32_t until = q->rq_prod;
	pthread_spin_unlock(&q->rq_lock);
	/* UD and UC have no RNR retry: a message that finds no receive is
	 * lost, so the receives must be the transport's before we return. */
	if (posted && qp->qp_type != IBV_QPT_RC)
		sr_wait_taken(q->map, SR_QP_RQ_CONS, until);
	return e;
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	struct sr_modify_qp m = { 0 };
	int e;

	m.handle = q->h;
	m.mask = mask;
	m.attr.qp_state = a->qp_state;
	m.attr.cur_state = a->cur_qp_state;
	m.attr.path_mtu = a->path_mtu;
	m.attr.qp_access_flags = a->qp_access_flags;
	m.attr.rq_psn = a->rq_psn;
	m.attr.sq_psn = a->sq_psn;
	m.attr.dest_qp_num = a->dest_qp_num;
	m.attr.qkey = a->qkey;
	m.attr.flow_label = a->ah_attr.grh.flow_label;
	m.attr.sgid_index = a->ah_attr.grh.sgid_index;
	m.attr.hop_limit = a->ah_attr.grh.hop_limit;
	m.attr.traffic_class = a->ah_attr.grh.traffic_class;
	m.attr.sl = a->ah_attr.sl;
	m.attr.is_global = a->ah_attr.is_global;
	memcpy(m.attr.dgid, a->ah_attr.grh.dgid.raw, 16);
	m.attr.timeout = a->timeout;
	m.attr.retry_cnt = a->retry_cnt;
	m.attr.rnr_retry = a->rnr_retry;
	m.attr.min_rnr_timer = a->min_rnr_timer;
	m.attr.max_rd_atomic = a->max_rd_atomic;
	m.attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
	m.attr.port_num = a->port_num;
	m.attr.pkey_index = a->pkey_index;
	e = ctx_call(qp->context, SR_OP_MODIFY_QP, &m, sizeof(m), NULL, 0, NULL);
	if (!e && (mask & IBV_QP_STATE))
		qp->state = a->qp_state;
	return e;
}

EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, struct ibv_qp_init_attr *ia)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	struct sr_handle h = { .handle = q->h };
	struct sr_qp_attr r;
	int e = ctx_call(qp->context, SR_OP_QUERY_QP, &h, sizeof(h), &r, sizeof(r), NULL);

	(void)mask;
	if (e)
		return e;
	memset(a, 0, sizeof(*a));
	a->qp_state = r.qp_state;
	a->cur_qp_state = r.cur_state;
	a->path_mtu = r.path_mtu;
	a->qp_access_flags = r.qp_access_flags;
	a->rq_psn = r.rq_psn;
	a->sq_psn = r.sq_psn;
	a->dest_qp_num = r.dest_qp_num;
	a->qkey = r.qkey;
	a->ah_attr.is_global = 1;
	memcpy(a->ah_attr.grh.dgid.raw, r.dgid, 16);
	a->ah_attr.grh.flow_label = r.flow_label;
	a->ah_attr.grh.sgid_index = r.sgid_index;
	a->ah_attr.grh.hop_limit = r.hop_limit;
	a->ah_attr.grh.traffic_class = r.traffic_class;
	a->ah_attr.sl = r.sl;
	a->ah_attr.port_num = r.port_num;
	a->timeout = r.timeout;
	a->retry_cnt = r.retry_cnt;
	a->rnr_retry = r.rnr_retry;
	a->min_rnr_timer = r.min_rnr_timer;
	a->max_rd_atomic = r.max_rd_atomic;
	a->max_dest_rd_atomic = r.max_dest_rd_atomic;
	a->port_num = r.port_num;
	a->pkey_index = r.pkey_index;
	a->cap = q->cap;
	qp->state = r.qp_state;
	if (ia) {
		memset(ia, 0, sizeof(*ia));
		ia->qp_context = qp->qp_context;
		ia->send_cq = qp->send_cq;
		ia->recv_cq = qp->recv_cq;
		ia->srq = qp->srq;
		ia->cap = q->cap;
		ia->qp_type = qp->qp_type;
	}
	return 0;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	struct sr_handle h = { .handle = q->h };
	int e = ctx_call(qp->context, SR_OP_DESTROY_QP, &h, sizeof(h), NULL, 0, NULL);

	if (e)
		return e;
	struct sr_context *x = to_ctx(qp->context);
	pthread_mutex_lock(&x->cqs_lock);
	for (struct sr_qp **pp = &x->qps; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&x->cqs_lock);
	munmap(q->map, q->len);
	free(q);
	return 0;
}

/* librdmacm's way to a QP's token (softroce_proto.h): every ibv_qp this
 * library hands out is an sr_qp. */
EXPORT int softroce_qp_token(struct ibv_qp *qp, uint64_t *token)
{
	if (!qp || !token) {
		errno = EINVAL;
		return -1;
	}
	*token = ((struct sr_qp *)qp)->token;
	return 0;
}

EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct sr_qp *q = (struct sr_qp *)qp;
	return q->ex ? &q->qpx : NULL; /* only QPs made with send ops have one */
}

/* ---- the extended send API (ibv_wr_*): WQEs go straight into the ring,
 * published by ibv_wr_complete ---- */

static inline struct sr_qp *to_qpx(struct ibv_qp_ex *x)
{
	return (struct sr_qp *)x;
}

static void wr_start(struct ibv_qp_ex *x)
{
	struct sr_qp *q = to_qpx(x);

	pthread_spin_lock(&q->sq_lock);
	q->wr_prod = q->sq_prod;
	q->wr_cons = atomic_load_explicit(at32(q->map, SR_QP_SQ_CONS), memory_order_acquire);
	q->wr_cur = NULL;
	q->wr_err = 0;
	if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_SQD && q->qp.state != IBV_QPS_ERR)
		q->wr_err = EINVAL;
}

/* wr_new begins the next WQE with the opcode; its SGEs or inline data follow. */
static struct sr_send_wqe *wr_new(struct ibv_qp_ex *x, uint32_t opcode)
{
	struct sr_qp *q = to_qpx(x);
	struct sr_send_wqe w = { 0 };

	q->wr_cur = NULL;
	if (q->wr_err)
		return NULL;
	if (q->wr_prod - q->wr_cons >= q->sq_size) {
		q->wr_err = ENOMEM;
		return NULL;
	}
	q->wr_cur = q->sq + (size_t)(q->wr_prod & (q->sq_size - 1)) * q->sq_stride;
	q->wr_prod++;
	w.wr_id = x->wr_id;
	w.opcode = opcode;
	w.send_flags = x->wr_flags;
	memcpy(q->wr_cur, &w, sizeof(w));
	return (struct sr_send_wqe *)q->wr_cur;
}

static void wr_send(struct ibv_qp_ex *x)
{
	wr_new(x, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	struct sr_send_wqe *w = wr_new(x, IBV_WR_SEND_WITH_IMM);
	if (w)
		memcpy(w->imm_data, &imm, 4);
}

static void wr_rdma(struct ibv_qp_ex *x, uint32_t op, uint32_t rkey, uint64_t raddr, const __be32 *imm)
{
	struct sr_send_wqe *w = wr_new(x, op);
	if (!w)
		return;
	w->rkey = rkey;
	w->remote_addr = raddr;
	if (imm)
		memcpy(w->imm_data, imm, 4);
}

static void wr_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr)
{
	wr_rdma(x, IBV_WR_RDMA_WRITE, rkey, raddr, NULL);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	wr_rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, &imm);
}

static void wr_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr)
{
	wr_rdma(x, IBV_WR_RDMA_READ, rkey, raddr, NULL);
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, uint64_t cmp, uint64_t swap)
{
	struct sr_send_wqe *w = wr_new(x, IBV_WR_ATOMIC_CMP_AND_SWP);
	if (!w)
		return;
	w->rkey = rkey;
	w->remote_addr = raddr;
	w->compare_add = cmp;
	w->swap = swap;
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t raddr, uint64_t add)
{
	struct sr_send_wqe *w = wr_new(x, IBV_WR_ATOMIC_FETCH_AND_ADD);
	if (!w)
		return;
	w->rkey = rkey;
	w->remote_addr = raddr;
	w->compare_add = add;
}

static void wr_set_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *sg)
{
	struct sr_qp *q = to_qpx(x);
	struct sr_send_wqe *w = (struct sr_send_wqe *)q->wr_cur;

	if (!w)
		return;
	if (n > q->max_send_sge) {
		q->wr_err = EINVAL;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct sr_sge s = { sg[i].addr, sg[i].length, sg[i].lkey };
		memcpy(q->wr_cur + sizeof(*w) + i * sizeof(s), &s, sizeof(s));
	}
	w->num_sge = n;
}

static void wr_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge s = { .addr = addr, .length = length, .lkey = lkey };
	wr_set_sge_list(x, 1, &s);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *b)
{
	struct sr_qp *q = to_qpx(x);
	struct sr_send_wqe *w = (struct sr_send_wqe *)q->wr_cur;
	size_t len = 0;

	if (!w)
		return;
	for (size_t i = 0; i < n; i++)
		len += b[i].length;
	if (len > q->max_inline) {
		q->wr_err = EINVAL;
		return;
	}
	uint8_t *p = q->wr_cur + sizeof(*w);
	for (size_t i = 0; i < n; i++) {
		memcpy(p, b[i].addr, b[i].length);
		p += b[i].length;
	}
	w->inline_len = len;
	w->send_flags |= IBV_SEND_INLINE;
}

static void wr_set_inline_data(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf b = { addr, length };
	wr_set_inline_data_list(x, 1, &b);
}

static void wr_send_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	struct sr_send_wqe *w = wr_new(x, IBV_WR_SEND_WITH_INV);
	if (w)
		w->invalidate_rkey = rkey;
}

static void wr_local_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	struct sr_send_wqe *w = wr_new(x, IBV_WR_LOCAL_INV);
	if (w)
		w->invalidate_rkey = rkey;
}

/* A BIND_MW work request (type 2), as through ibv_post_send. */
static void wr_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *b)
{
	struct sr_send_wqe *w = wr_new(x, IBV_WR_BIND_MW);
	if (w)
		bind_wqe(w, mw, rkey, b, false);
}

static int wr_complete(struct ibv_qp_ex *x)
{
	struct sr_qp *q = to_qpx(x);
	int e = q->wr_err;

	if (!e && q->wr_prod != q->sq_prod) {
		q->sq_prod = q->wr_prod;
		atomic_store_explicit(at32(q->map, SR_QP_SQ_PROD), q->sq_prod, memory_order_release);
		doorbell(q);
	}
	pthread_spin_unlock(&q->sq_lock);
	return e;
}

static void wr_abort(struct ibv_qp_ex *x)
{
	pthread_spin_unlock(&to_qpx(x)->sq_lock);
}

#define SR_SEND_OPS                                                                                       \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |           \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |  \
	 IBV_QP_EX_WITH_SEND_WITH_INV)

static struct ibv_qp *sr_create_qp_ex(struct ibv_context *c, struct ibv_qp_init_attr_ex *a)
{
	const uint32_t known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	struct ibv_qp_init_attr ia;
	struct sr_qp *q;

	(void)c;
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || (a->comp_mask & ~known)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~(uint64_t)SR_SEND_OPS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	memset(&ia, 0, sizeof(ia));
	ia.qp_context = a->qp_context;
	ia.send_cq = a->send_cq;
	ia.recv_cq = a->recv_cq;
	ia.srq = a->srq;
	ia.cap = a->cap;
	ia.qp_type = a->qp_type;
	ia.sq_sig_all = a->sq_sig_all;
	q = create_qp(a->pd, &ia);
	if (!q)
		return NULL;
	a->cap = ia.cap;
	if (a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		struct ibv_qp_ex *x = &q->qpx;
		q->ex = true;
		x->wr_send = wr_send;
		x->wr_send_imm = wr_send_imm;
		x->wr_rdma_write = wr_rdma_write;
		x->wr_rdma_write_imm = wr_rdma_write_imm;
		x->wr_rdma_read = wr_rdma_read;
		x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
		x->wr_atomic_fetch_add = wr_atomic_fetch_add;
		x->wr_send_inv = wr_send_inv;
		x->wr_local_inv = wr_local_inv;
		x->wr_bind_mw = wr_bind_mw;
		x->wr_set_sge = wr_set_sge;
		x->wr_set_sge_list = wr_set_sge_list;
		x->wr_set_inline_data = wr_set_inline_data;
		x->wr_set_inline_data_list = wr_set_inline_data_list;
		x->wr_start = wr_start;
		x->wr_complete = wr_complete;
		x->wr_abort = wr_abort;
		if (a->qp_type == IBV_QPT_UD)
			x->wr_set_ud_addr = sr_wr_set_ud_addr;
	}
	return &q->qp;
}

/* ---- events, fork, misc ---- */

EXPORT int ibv_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
	struct sr_context *x = to_ctx(c);
	struct sr_async_event a;

	for (;;) {
		ssize_t n = read(c->async_fd, &a, sizeof(a));
		if (n != sizeof(a))
			return -1; /* errno from read: EAGAIN on a non-blocking fd, EINTR on a signal */
		memset(ev, 0, sizeof(*ev));
		ev->event_type = a.type;
		switch (a.type) {
		case IBV_EVENT_CQ_ERR: {
			struct sr_cq *q;
			pthread_mutex_lock(&x->cqs_lock);
			for (q = x->cqs; q && q->h != a.handle; q = q->next)
				;
			pthread_mutex_unlock(&x->cqs_lock);
			if (!q)
				continue; /* destroyed meanwhile */
			ev->element.cq = &q->cq;
			return 0;
		}
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
		case IBV_EVENT_QP_LAST_WQE_REACHED: {
			struct sr_qp *q;
			pthread_mutex_lock(&x->cqs_lock);
			for (q = x->qps; q && q->h != a.handle; q = q->next)
				;
			pthread_mutex_unlock(&x->cqs_lock);
			if (!q)
				continue;
			ev->element.qp = &q->qp;
			return 0;
		}
		case IBV_EVENT_SRQ_ERR:
		case IBV_EVENT_SRQ_LIMIT_REACHED:
			ev->element.srq = sr_srq_of_event(x, a.handle);
			if (!ev->element.srq)
				continue;
			return 0;
		default:
			ev->element.port_num = 1;
			return 0;
		}
	}
}

EXPORT void ibv_ack_async_event(struct ibv_async_event *ev)
{
	struct ibv_qp *qp;
	struct ibv_cq *cq;

	switch (ev->event_type) {
	case IBV_EVENT_CQ_ERR:
		cq = ev->element.cq;
		pthread_mutex_lock(&cq->mutex);
		cq->async_events_completed++;
		pthread_cond_signal(&cq->cond);
		pthread_mutex_unlock(&cq->mutex);
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		qp = ev->element.qp;
		pthread_mutex_lock(&qp->mutex);
		qp->events_completed++;
		pthread_cond_signal(&qp->cond);
		pthread_mutex_unlock(&qp->mutex);
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: {
		struct ibv_srq *srq = ev->element.srq;
		pthread_mutex_lock(&srq->mutex);
		srq->events_completed++;
		pthread_cond_signal(&srq->cond);
		pthread_mutex_unlock(&srq->mutex);
		break;
	}
	default:
		break;
	}
}

EXPORT int ibv_fork_init(void)
{
	return 0;
}

EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	(void)dir;
	(void)file;
	(void)buf;
	(void)size;
	return -1; /* there is no sysfs for a softroce device */
}

EXPORT const char *ibv_get_sysfs_path(void)
{
	return "/sys";
}

EXPORT bool verbs_allow_disassociate_destroy;

EXPORT const char *ibv_wc_status_str(enum ibv_wc_status s)
{
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	if ((unsigned)s < sizeof(names) / sizeof(names[0]) && names[s])
		return names[s];
	return "unknown";
}

EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const names[] = { "unknown", "InfiniBand channel adapter", "InfiniBand switch",
					     "InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP", "unspecified" };
	int i = (int)t + 1;
	if (i < 0 || i >= (int)(sizeof(names) / sizeof(names[0])))
		i = 0;
	return names[i];
}

EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const names[] = { "PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
					     "PORT_ACTIVE_DEFER" };
	if ((unsigned)s < sizeof(names) / sizeof(names[0]))
		return names[s];
	return "invalid state";
}

EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const names[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	if ((unsigned)e < sizeof(names) / sizeof(names[0]) && names[e])
		return names[e];
	return "unknown";
}

EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	static const int m[] = { [IBV_RATE_2_5_GBPS] = 1, [IBV_RATE_5_GBPS] = 2, [IBV_RATE_10_GBPS] = 4,
				 [IBV_RATE_20_GBPS] = 8, [IBV_RATE_30_GBPS] = 12, [IBV_RATE_40_GBPS] = 16,
				 [IBV_RATE_60_GBPS] = 24, [IBV_RATE_80_GBPS] = 32, [IBV_RATE_120_GBPS] = 48 };
	if ((unsigned)rate < sizeof(m) / sizeof(m[0]) && m[rate])
		return m[rate];
	return -1;
}

EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (int r = 0; r <= IBV_RATE_120_GBPS; r++)
		if (ibv_rate_to_mult(r) == mult)
			return r;
	return IBV_RATE_MAX;
}

EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	int m = ibv_rate_to_mult(rate);
	return m > 0 ? m * 2500 : -1;
}

EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	return mbps % 2500 ? IBV_RATE_MAX : mult_to_ibv_rate(mbps / 2500);
}

/* ---- not supported yet (multicast) ---- */

EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp;
	(void)gid;
	(void)lid;
	return EOPNOTSUPP;
}

/* Providers register through the private ABI; there are none here. */
EXPORT void ibv_register_driver(const char *name, void *init)
{
	(void)name;
	(void)init;
}

#include "verbs_ud.c"
