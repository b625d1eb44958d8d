/*
 * UD address handles and shared receive queues (included at the end of
 * verbs.c, whose objects and helpers it uses). A UD send carries its AH's
 * handle, remote QPN and Q_Key in the send WQE's appended fields; an SRQ
 * is a receive ring in shared memory that ibv_post_srq_recv fills with no
 * system call, as ibv_post_recv does a QP's.
 */

#include <time.h>

struct sr_ah {
	struct ibv_ah ah;
	uint32_t h;
};

struct sr_srq {
	struct ibv_srq srq;
	uint32_t h;
	uint8_t *map;
	size_t len;
	uint8_t *rq;
	uint8_t *old_map; /* the ring before the last resize: a UD poster may still wait on it */
	size_t old_len;
	uint32_t size, stride, prod, max_sge;
	_Atomic bool unreliable; /* a UD or UC QP uses it: posts wait for the daemon */
	int bell;
	pthread_spinlock_t lock;
	struct sr_srq *next;
};

/* ---- address handles ---- */

EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct sr_create_ah req = { 0 };
	struct sr_handle r;
	struct sr_ah *a;
	int e;

	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	req.pd = ((struct sr_pd *)pd)->h;
	req.is_global = attr->is_global;
	req.sgid_index = attr->grh.sgid_index;
	req.flow_label = attr->grh.flow_label;
	req.hop_limit = attr->grh.hop_limit;
	req.traffic_class = attr->grh.traffic_class;
	req.sl = attr->sl;
	req.port_num = attr->port_num;
	memcpy(req.dgid, attr->grh.dgid.raw, 16);
	a = calloc(1, sizeof(*a));
	if (!a) {
		errno = ENOMEM;
		return NULL;
	}
	e = ctx_call(pd->context, SR_OP_CREATE_AH, &req, sizeof(req), &r, sizeof(r), NULL);
	if (e) {
		free(a);
		errno = e;
		return NULL;
	}
	a->ah.context = pd->context;
	a->ah.pd = pd;
	a->ah.handle = r.handle;
	a->h = r.handle;
	return &a->ah;
}

EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	struct sr_ah *a = (struct sr_ah *)ah;
	struct sr_handle h = { .handle = a->h };
	int e = ctx_call(ah->context, SR_OP_DESTROY_AH, &h, sizeof(h), NULL, 0, NULL);

	if (e)
		return e;
	free(a);
	return 0;
}

/* ibv_init_ah_from_wc: the address back to a UD datagram's sender, from
 * the 40 bytes at the head of the receive buffer. On RoCEv2 over IPv4 the
 * IPv4 header is the GRH's last 20 bytes; over IPv6 the GRH is the IPv6
 * header. The source GID index is the one holding the datagram's
 * destination. */
EXPORT int ibv_init_ah_from_wc(struct ibv_context *c, uint8_t port, struct ibv_wc *wc, struct ibv_grh *grh,
			       struct ibv_ah_attr *ah)
{
	const uint8_t *g = (const uint8_t *)grh;
	uint8_t src[16] = { 0 }, dst[16] = { 0 };
	uint8_t tclass;
	uint32_t flow = 0;
	struct sr_port_attr pa;
	struct sr_handle pq = { .handle = port };

	if (!(wc->wc_flags & IBV_WC_GRH))
		return -1; /* no GRH: not a UD receive */
	if ((g[0] >> 4) == 6) {
		uint32_t v;
		memcpy(&v, g, 4);
		v = be32toh(v);
		tclass = (v >> 20) & 0xff;
		flow = v & 0xfffff;
		memcpy(src, g + 8, 16);
		memcpy(dst, g + 24, 16);
	} else if ((g[20] >> 4) == 4) {
		tclass = g[21];
		src[10] = src[11] = dst[10] = dst[11] = 0xff;
		memcpy(src + 12, g + 32, 4);
		memcpy(dst + 12, g + 36, 4);
	} else {
		errno = EINVAL;
		return -1;
	}
	if (ctx_call(c, SR_OP_QUERY_PORT, &pq, sizeof(pq), &pa, sizeof(pa), NULL)) {
		errno = EINVAL;
		return -1;
	}
	for (uint32_t i = 0; i < pa.gid_tbl_len; i++) {
		struct sr_gid r;
		if (gid(c, port, i, &r))
			break;
		if (memcmp(r.raw, dst, 16))
			continue;
		memset(ah, 0, sizeof(*ah));
		ah->dlid = wc->slid;
		ah->sl = wc->sl;
		ah->src_path_bits = wc->dlid_path_bits;
		ah->port_num = port;
		ah->is_global = 1;
		memcpy(ah->grh.dgid.raw, src, 16);
		ah->grh.sgid_index = i;
		ah->grh.flow_label = flow;
		ah->grh.hop_limit = 0xff;
		ah->grh.traffic_class = tclass;
		return 0;
	}
	errno = ENOENT; /* sent to an address that is not in the GID table */
	return -1;
}

EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh, uint8_t port)
{
	struct ibv_ah_attr a;

	if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &a))
		return NULL;
	return ibv_create_ah(pd, &a);
}

/* The UD fields of a send WQE; the daemon checks the AH is the client's. */
static void sr_ud_wqe(struct sr_qp *q, const struct ibv_send_wr *wr, struct sr_send_wqe *w)
{
	(void)q;
	w->ah = wr->wr.ud.ah ? ((struct sr_ah *)wr->wr.ud.ah)->h : 0;
	w->remote_qpn = wr->wr.ud.remote_qpn;
	w->remote_qkey = wr->wr.ud.remote_qkey;
}

/* ibv_wr_set_ud_addr: the destination of the WQE ibv_wr_send began. */
static void sr_wr_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct sr_qp *q = (struct sr_qp *)x;
	struct sr_send_wqe *w = (struct sr_send_wqe *)q->wr_cur;

	if (!w)
		return;
	w->ah = ah ? ((struct sr_ah *)ah)->h : 0;
	w->remote_qpn = qpn;
	w->remote_qkey = qkey;
}

/* sr_wait_taken waits until the daemon has consumed the ring up to prod
 * (it posted those WQEs to the transport, or refused them and flagged the
 * queue). The caller rang the doorbell if the daemon slept. Bounded: a
 * daemon that does not answer in a second leaves the WQEs in the ring. */
static void sr_wait_taken(uint8_t *map, uint32_t cons_off, uint32_t prod)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned i = 0;; i++) {
		uint32_t cons = atomic_load_explicit(at32(map, cons_off), memory_order_acquire);
		if ((int32_t)(prod - cons) <= 0 || atomic_load_explicit(at32(map, SR_QP_ERROR), memory_order_relaxed))
			return;
		if (i < 64)
			continue;
		sched_yield();
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec >= 2 || (t.tv_sec - t0.tv_sec == 1 && t.tv_nsec >= t0.tv_nsec))
			return;
	}
}

/* ---- shared receive queues ---- */

static uint32_t sr_srq_handle(struct ibv_srq *s)
{
	return ((struct sr_srq *)s)->h;
}

static void sr_srq_unreliable(struct ibv_srq *s)
{
	atomic_store(&((struct sr_srq *)s)->unreliable, true);
}

static struct ibv_srq *sr_srq_of_event(struct sr_context *x, uint32_t handle)
{
	struct sr_srq *s;

	pthread_mutex_lock(&x->cqs_lock);
	for (s = x->srqs; s && s->h != handle; s = s->next)
		;
	pthread_mutex_unlock(&x->cqs_lock);
	return s ? &s->srq : NULL;
}

EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *ia)
{
	struct sr_create_srq req = { 0 };
	struct sr_srq_resp r;
	struct sr_context *x;
	struct sr_srq *s;
	int fd = -1, e;
	void *map;

	if (!pd || !ia) {
		errno = EINVAL;
		return NULL;
	}
	x = to_ctx(pd->context);
	req.pd = ((struct sr_pd *)pd)->h;
	req.max_wr = ia->attr.max_wr;
	req.max_sge = ia->attr.max_sge;
	req.srq_limit = ia->attr.srq_limit;
	e = ctx_call(pd->context, SR_OP_CREATE_SRQ, &req, sizeof(req), &r, sizeof(r), &fd);
	if (e) {
		errno = e;
		return NULL;
	}
	map = mmap(NULL, r.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	s = calloc(1, sizeof(*s));
	if (map == MAP_FAILED || !s || r.size == 0 || (r.size & (r.size - 1)) ||
	    r.stride < sizeof(struct sr_recv_wqe) + (uint64_t)r.max_sge * sizeof(struct sr_sge) ||
	    r.rq_off < SR_PAGE || r.rq_off + (uint64_t)r.size * r.stride > r.map_len) {
		struct sr_handle d = { .handle = r.handle };
		ctx_call(pd->context, SR_OP_DESTROY_SRQ, &d, sizeof(d), NULL, 0, NULL);
		if (map != MAP_FAILED)
			munmap(map, r.map_len);
		free(s);
		errno = ENOMEM;
		return NULL;
	}
	s->srq.context = pd->context;
	s->srq.srq_context = ia->srq_context;
	s->srq.pd = pd;
	s->srq.handle = r.handle;
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	s->h = r.handle;
	s->map = map;
	s->len = r.map_len;
	s->rq = (uint8_t *)map + r.rq_off;
	s->size = r.size;
	s->stride = r.stride;
	s->max_sge = r.max_sge;
	s->bell = x->bell;
	pthread_spin_init(&s->lock, PTHREAD_PROCESS_PRIVATE);
	ia->attr.max_wr = r.max_wr;
	ia->attr.max_sge = r.max_sge;
	pthread_mutex_lock(&x->cqs_lock);
	s->next = x->srqs;
	x->srqs = s;
	pthread_mutex_unlock(&x->cqs_lock);
	return &s->srq;
}

/* IBV_SRQ_MAX_WR: the daemon sends a new ring holding the WQEs it has not
 * taken at the same indices (s->prod stays valid). Posts wait on s->lock
 * for the call: one made to the old ring after the daemon copied it would
 * be lost. The old ring stays mapped until the next resize: a UD or UC
 * poster that took it before the swap may still be waiting on it. */
EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *a, int mask)
{
	struct sr_srq *s = (struct sr_srq *)srq;
	struct sr_modify_srq m = { .handle = sr_srq_handle(srq), .mask = mask, .max_wr = a->max_wr,
				   .srq_limit = a->srq_limit };
	struct sr_srq_resp r;
	uint8_t *old = NULL;
	size_t oldlen = 0;
	int fd = -1, e;
	void *map;

	if (!(mask & IBV_SRQ_MAX_WR))
		return ctx_call(srq->context, SR_OP_MODIFY_SRQ, &m, sizeof(m), NULL, 0, NULL);
	pthread_spin_lock(&s->lock);
	e = ctx_call(srq->context, SR_OP_RESIZE_SRQ, &m, sizeof(m), &r, sizeof(r), &fd);
	if (!e) {
		map = mmap(NULL, r.map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (map == MAP_FAILED) {
			e = ENOMEM;
		} else if (r.size == 0 || (r.size & (r.size - 1)) || r.max_sge != s->max_sge ||
			   r.stride < sizeof(struct sr_recv_wqe) + (uint64_t)r.max_sge * sizeof(struct sr_sge) ||
			   r.rq_off < SR_PAGE || r.rq_off + (uint64_t)r.size * r.stride > r.map_len) {
			munmap(map, r.map_len);
			e = EPROTO;
		} else {
			old = s->map;
			oldlen = s->len;
			s->map = map;
			s->len = r.map_len;
			s->rq = (uint8_t *)map + r.rq_off;
			s->size = r.size;
			s->stride = r.stride;
		}
	}
	if (old) {
		uint8_t *gone = s->old_map;
		size_t gonelen = s->old_len;
		s->old_map = old;
		s->old_len = oldlen;
		old = gone;
		oldlen = gonelen;
	}
	pthread_spin_unlock(&s->lock);
	if (old)
		munmap(old, oldlen);
	return e;
}

EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *a)
{
	struct sr_handle h = { .handle = sr_srq_handle(srq) };
	struct sr_srq_attr r;
	int e = ctx_call(srq->context, SR_OP_QUERY_SRQ, &h, sizeof(h), &r, sizeof(r), NULL);

	if (e)
		return e;
	a->max_wr = r.max_wr;
	a->max_sge = r.max_sge;
	a->srq_limit = r.srq_limit;
	return 0;
}

EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct sr_srq *s = (struct sr_srq *)srq;
	struct sr_context *x = to_ctx(srq->context);
	struct sr_handle h = { .handle = s->h };
	int e = ctx_call(srq->context, SR_OP_DESTROY_SRQ, &h, sizeof(h), NULL, 0, NULL);

	if (e)
		return e;
	pthread_mutex_lock(&x->cqs_lock);
	for (struct sr_srq **pp = &x->srqs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	pthread_mutex_unlock(&x->cqs_lock);
	munmap(s->map, s->len);
	if (s->old_map)
		munmap(s->old_map, s->old_len);
	free(s);
	return 0;
}

static int sr_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct sr_srq *s = (struct sr_srq *)srq;
	uint32_t cons;
	int e = 0, posted = 0;

	pthread_spin_lock(&s->lock);
	cons = atomic_load_explicit(at32(s->map, SR_SRQ_CONS), memory_order_acquire);
	for (; wr; wr = wr->next) {
		uint8_t *slot;
		struct sr_recv_wqe w = { 0 };
		if (s->prod - cons >= s->size) {
			e = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_sge) {
			e = EINVAL;
			break;
		}
		slot = s->rq + (size_t)(s->prod & (s->size - 1)) * s->stride;
		w.wr_id = wr->wr_id;
		w.num_sge = wr->num_sge;
		for (int i = 0; i < wr->num_sge; i++) {
			struct sr_sge g = { wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey };
			memcpy(slot + sizeof(w) + i * sizeof(g), &g, sizeof(g));
		}
		memcpy(slot, &w, sizeof(w));
		s->prod++;
		posted++;
	}
	if (e)
		*bad = wr;
	if (posted) {
		atomic_store_explicit(at32(s->map, SR_SRQ_PROD), s->prod, memory_order_release);
		/* As doorbell() for a QP: the index store, then the flag load. */
		atomic_thread_fence(memory_order_seq_cst);
		if (atomic_load_explicit(at32(s->map, SR_QP_SLEEPING), memory_order_relaxed)) {
			uint64_t one = 1;
			ssize_t n = write(s->bell, &one, sizeof(one));
			(void)n;
		}
	}
	uint32_t until = s->prod;
	uint8_t *map = s->map;
	pthread_spin_unlock(&s->lock);
	if (posted && atomic_load_explicit(&s->unreliable, memory_order_relaxed))
		sr_wait_taken(map, SR_SRQ_CONS, until);
	return e;
}
