/* ibv_resize_cq and ibv_modify_srq(IBV_SRQ_MAX_WR) as rxe does them: a CQ
 * shrinks and grows with completions queued, keeping their order, but not
 * below the completions it holds; it resizes while a peer sends to it; an
 * SRQ grows with receives posted and then takes more than its old size,
 * refuses a size below its posted WQEs or its armed limit, and reports
 * its new max_wr; an armed CQ stays armed across a resize, an extended
 * CQ resizes as a plain one. Prints "ok". */
#include "pair.h"
#include <poll.h>
#include <sched.h>

#define SLOT 64

static char *buf;
static struct ibv_mr *mr;

static void post_recv(struct ibv_qp *qp, uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)buf + 32768 + (id % 256) * SLOT, SLOT, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &w, &bad))
		die("post recv %llu: %s", (unsigned long long)id, strerror(errno));
}

static void post_srq(struct ibv_srq *srq, uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)buf + 32768 + (id % 256) * SLOT, SLOT, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	int e = ibv_post_srq_recv(srq, &w, &bad);
	if (e)
		die("post SRQ recv %llu: %s", (unsigned long long)id, strerror(e));
}

/* send posts a signaled SEND of seq (in its payload) on qp. */
static void send_seq(struct ibv_qp *qp, uint32_t seq)
{
	char *p = buf + (seq % 256) * SLOT;
	memcpy(p, &seq, 4);
	struct ibv_sge s = { (uintptr_t)p, 4, mr->lkey };
	struct ibv_send_wr w = { .wr_id = seq, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ibv_post_send(qp, &w, &bad))
		die("post send %u: %s", seq, strerror(errno));
}

static struct ibv_wc poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0)
		die("poll_cq");
	if (wc.status != IBV_WC_SUCCESS)
		die("wr %llu: status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	return wc;
}

/* recv_check takes the next receive completion of cq: wr_id id, payload seq. */
static void recv_check(struct ibv_cq *cq, uint64_t id, uint32_t seq)
{
	struct ibv_wc wc = poll1(cq);
	uint32_t got;
	if (wc.opcode != IBV_WC_RECV || wc.wr_id != id)
		die("receive completion: opcode %d wr_id %llu, want wr_id %llu", wc.opcode, (unsigned long long)wc.wr_id,
		    (unsigned long long)id);
	memcpy(&got, buf + 32768 + (id % 256) * SLOT, 4);
	if (wc.byte_len != 4 || got != seq)
		die("receive %llu carries %u (%u bytes), want %u", (unsigned long long)id, got, wc.byte_len, seq);
}

static void resize(struct ibv_cq *cq, int cqe, int want)
{
	int e = ibv_resize_cq(cq, cqe);
	if (e)
		die("resize_cq %d: %s", cqe, strerror(e));
	if (cq->cqe != want)
		die("resize_cq %d: cqe %d, want %d", cqe, cq->cqe, want);
}

int main(void)
{
	struct pair p;
	pair_open(&p);
	buf = calloc(1, 65536);
	mr = ibv_reg_mr(p.pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("reg_mr");
	uint32_t seq = 0;

	/* Completions queued: 12 receives wait on cqb while it shrinks, then
	 * grows; the order is kept. */
	for (int i = 0; i < 12; i++)
		post_recv(p.qb, 100 + i);
	for (int i = 0; i < 12; i++)
		send_seq(p.qa, seq + i);
	for (int i = 0; i < 12; i++)
		if (poll1(p.cqa).wr_id != seq + (uint32_t)i)
			die("send completions out of order");
	/* The responder completes a receive before it acknowledges it. */
	if (ibv_resize_cq(p.cqb, 11) != EINVAL)
		die("resize_cq below the 12 completions held did not fail with EINVAL");
	if (ibv_resize_cq(p.cqb, 0) != EINVAL || ibv_resize_cq(p.cqb, -1) != EINVAL || ibv_resize_cq(p.cqb, 1 << 30) != EINVAL)
		die("absurd sizes");
	if (p.cqb->cqe != 64)
		die("a refused resize changed cqe to %d", p.cqb->cqe);
	resize(p.cqb, 12, 16);
	for (int i = 0; i < 5; i++)
		recv_check(p.cqb, 100 + i, seq + i);
	resize(p.cqb, 200, 256);
	for (int i = 5; i < 12; i++)
		recv_check(p.cqb, 100 + i, seq + i);
	seq += 12;
	/* More traffic on the resized ring, then on a one-slot one. */
	for (int r = 0; r < 4; r++) {
		for (int i = 0; i < 16; i++)
			post_recv(p.qb, seq + i);
		for (int i = 0; i < 16; i++)
			send_seq(p.qa, seq + i);
		for (int i = 0; i < 16; i++) {
			recv_check(p.cqb, seq + i, seq + i);
			poll1(p.cqa);
		}
		seq += 16;
	}
	resize(p.cqb, 1, 1);
	for (int i = 0; i < 8; i++, seq++) {
		post_recv(p.qb, seq);
		send_seq(p.qa, seq);
		recv_check(p.cqb, seq, seq);
		poll1(p.cqa);
	}
	resize(p.cqb, 64, 64);

	/* Resizes while the peer sends: the transport delivers into cqb while
	 * the daemon migrates it. */
	uint32_t next = seq, sent = seq, end = seq + 3000;
	int sizes[] = { 16, 32, 64, 17 };
	for (int i = 0; i < 16; i++)
		post_recv(p.qb, sent + i);
	for (int i = 0; i < 16; i++)
		send_seq(p.qa, sent++);
	for (int k = 0; next < end; k++) {
		if (k % 7 == 0)
			resize(p.cqb, sizes[k % 4], sizes[k % 4] == 17 ? 32 : sizes[k % 4]);
		recv_check(p.cqb, next, next);
		next++;
		poll1(p.cqa);
		if (sent < end) {
			post_recv(p.qb, sent);
			send_seq(p.qa, sent++);
		}
	}
	seq = end;

	/* SRQ: 8 posted, grown to 32, then 32 more taken than it held. */
	union ibv_gid gid;
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(p.pd, &si);
	if (!srq || si.attr.max_wr != 8)
		die("create_srq: %s", strerror(errno));
	struct ibv_qp_init_attr ia = { .send_cq = p.cqb, .recv_cq = p.cqb, .srq = srq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 16, .max_send_sge = 1 } };
	struct ibv_qp *qs = ibv_create_qp(p.pd, &ia);
	ia.srq = NULL;
	ia.send_cq = ia.recv_cq = p.cqa;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *qt = ibv_create_qp(p.pd, &ia);
	if (!qs || !qt || ibv_query_gid(p.c, 1, 0, &gid))
		die("SRQ QPs: %s", strerror(errno));
	to_rts(qs, qt->qp_num, &gid);
	to_rts(qt, qs->qp_num, &gid);
	for (int i = 0; i < 8; i++)
		post_srq(srq, 1000 + i);
	struct ibv_srq_attr sa = { .max_wr = 4 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) != EINVAL)
		die("SRQ shrunk below its 8 posted WQEs");
	sa = (struct ibv_srq_attr){ .max_wr = 32, .srq_limit = 40 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != EINVAL)
		die("SRQ limit above the new max_wr");
	sa = (struct ibv_srq_attr){ .max_wr = 0 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) != EINVAL)
		die("SRQ max_wr 0");
	sa = (struct ibv_srq_attr){ .max_wr = 1 << 30 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) != EINVAL)
		die("SRQ max_wr 2^30");
	if (ibv_query_srq(srq, &sa) || sa.max_wr != 8)
		die("a refused resize changed max_wr to %u", sa.max_wr);
	sa = (struct ibv_srq_attr){ .max_wr = 32 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR))
		die("grow SRQ: %s", strerror(errno));
	if (ibv_query_srq(srq, &sa) || sa.max_wr != 32 || sa.max_sge != 1)
		die("query_srq after growing: max_wr %u max_sge %u", sa.max_wr, sa.max_sge);
	for (int i = 8; i < 32; i++)
		post_srq(srq, 1000 + i);
	/* qt's 32 sends in two rounds of 16 (its send queue's depth). */
	for (int r = 0; r < 2; r++) {
		for (int i = 0; i < 16; i++)
			send_seq(qt, seq + r * 16 + i);
		for (int i = 0; i < 16; i++) {
			recv_check(p.cqb, 1000 + r * 16 + i, seq + r * 16 + i);
			poll1(p.cqa);
		}
	}
	seq += 32;
	/* Limit rules: an armed limit over the new size refuses the resize. */
	sa = (struct ibv_srq_attr){ .srq_limit = 20 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT))
		die("arm limit: %s", strerror(errno));
	sa = (struct ibv_srq_attr){ .max_wr = 16 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) != EINVAL)
		die("SRQ shrunk below its armed limit");
	sa = (struct ibv_srq_attr){ .srq_limit = 40 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) != EINVAL)
		die("limit above max_wr");
	sa = (struct ibv_srq_attr){ .max_wr = 64, .srq_limit = 3 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		die("grow and arm: %s", strerror(errno));
	if (ibv_query_srq(srq, &sa) || sa.max_wr != 64 || sa.srq_limit != 3)
		die("query_srq: max_wr %u limit %u", sa.max_wr, sa.srq_limit);
	/* Shrinking to what is posted is allowed, as rxe. */
	for (int i = 0; i < 10; i++)
		post_srq(srq, 2000 + i);
	sa = (struct ibv_srq_attr){ .max_wr = 10 };
	if (ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR))
		die("shrink SRQ to its posted WQEs: %s", strerror(errno));
	if (ibv_query_srq(srq, &sa) || sa.max_wr != 16)
		die("query_srq after shrinking: max_wr %u", sa.max_wr);
	for (int i = 0; i < 10; i++)
		send_seq(qt, seq + i);
	for (int i = 0; i < 10; i++) {
		recv_check(p.cqb, 2000 + i, seq + i);
		poll1(p.cqa);
	}
	seq += 10;

	/* An SRQ whose ring holds WQEs its full verbs SRQ has not taken: the
	 * resize moves them too, in order. */
	si = (struct ibv_srq_init_attr){ .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq2 = ibv_create_srq(p.pd, &si);
	ia = (struct ibv_qp_init_attr){ .send_cq = p.cqb, .recv_cq = p.cqb, .srq = srq2, .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 16, .max_send_sge = 1 } };
	struct ibv_qp *qs2 = srq2 ? ibv_create_qp(p.pd, &ia) : NULL;
	ia.srq = NULL;
	ia.send_cq = ia.recv_cq = p.cqa;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *qt2 = ibv_create_qp(p.pd, &ia);
	if (!qs2 || !qt2)
		die("second SRQ: %s", strerror(errno));
	to_rts(qs2, qt2->qp_num, &gid);
	to_rts(qt2, qs2->qp_num, &gid);
	for (int i = 0; i < 8; i++) {
		struct ibv_sge sg = { (uintptr_t)buf + 32768 + ((3000 + i) % 256) * SLOT, SLOT, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 3000 + i, .sg_list = &sg, .num_sge = 1 }, *bad;
		int e;
		while ((e = ibv_post_srq_recv(srq2, &w, &bad)) == ENOMEM)
			sched_yield(); /* the ring is full until the daemon takes its WQEs */
		if (e)
			die("post SRQ recv: %s", strerror(e));
	}
	sa = (struct ibv_srq_attr){ .max_wr = 16 };
	if (ibv_modify_srq(srq2, &sa, IBV_SRQ_MAX_WR))
		die("grow an SRQ with WQEs in its ring: %s", strerror(errno));
	for (int i = 8; i < 16; i++)
		post_srq(srq2, 3000 + i);
	for (int i = 0; i < 16; i++)
		send_seq(qt2, seq + i);
	for (int i = 0; i < 16; i++) {
		recv_check(p.cqb, 3000 + i, seq + i);
		poll1(p.cqa);
	}
	if (ibv_destroy_qp(qs2) || ibv_destroy_qp(qt2) || ibv_destroy_srq(srq2))
		die("second SRQ teardown");
	seq += 16;

	/* An armed CQ keeps its arm across a resize: the completion after it
	 * comes with an event. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(p.c);
	struct ibv_cq *cqc = ch ? ibv_create_cq(p.c, 4, NULL, ch, 0) : NULL;
	if (!cqc)
		die("CQ with a channel: %s", strerror(errno));
	ia = (struct ibv_qp_init_attr){ .send_cq = cqc, .recv_cq = cqc, .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qr = ibv_create_qp(p.pd, &ia);
	ia.send_cq = ia.recv_cq = p.cqa;
	struct ibv_qp *qu = ibv_create_qp(p.pd, &ia);
	if (!qr || !qu)
		die("channel QPs: %s", strerror(errno));
	to_rts(qr, qu->qp_num, &gid);
	to_rts(qu, qr->qp_num, &gid);
	if (ibv_req_notify_cq(cqc, 0))
		die("req_notify_cq");
	resize(cqc, 64, 64);
	post_recv(qr, 5000);
	send_seq(qu, seq);
	struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
	if (poll(&pf, 1, 30000) != 1) /* a hang turned into a failure, not a speed bound */
		die("no completion event after resizing an armed CQ");
	struct ibv_cq *evcq;
	void *evctx;
	if (ibv_get_cq_event(ch, &evcq, &evctx) || evcq != cqc)
		die("get_cq_event");
	ibv_ack_cq_events(cqc, 1);
	recv_check(cqc, 5000, seq);
	poll1(p.cqa);
	if (ibv_destroy_qp(qr) || ibv_destroy_qp(qu) || ibv_destroy_cq(cqc) || ibv_destroy_comp_channel(ch))
		die("channel teardown");
	seq++;

	/* An extended CQ resized with completions queued: start_poll and
	 * next_poll read them in order from the new ring. */
	struct ibv_cq_init_attr_ex ca = { .cqe = 4, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cx = ibv_create_cq_ex(p.c, &ca);
	if (!cx)
		die("create_cq_ex: %s", strerror(errno));
	ia = (struct ibv_qp_init_attr){ .send_cq = ibv_cq_ex_to_cq(cx), .recv_cq = ibv_cq_ex_to_cq(cx), .qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	qr = ibv_create_qp(p.pd, &ia);
	ia.send_cq = ia.recv_cq = p.cqa;
	qu = ibv_create_qp(p.pd, &ia);
	if (!qr || !qu)
		die("extended CQ QPs: %s", strerror(errno));
	to_rts(qr, qu->qp_num, &gid);
	to_rts(qu, qr->qp_num, &gid);
	for (int i = 0; i < 3; i++)
		post_recv(qr, 6000 + i);
	for (int i = 0; i < 3; i++)
		send_seq(qu, seq + i);
	for (int i = 0; i < 3; i++)
		poll1(p.cqa);
	if (ibv_resize_cq(ibv_cq_ex_to_cq(cx), 2) != EINVAL)
		die("extended CQ resized below its 3 completions");
	resize(ibv_cq_ex_to_cq(cx), 16, 16);
	struct ibv_poll_cq_attr pa = { 0 };
	int e, got = 0;
	while ((e = ibv_start_poll(cx, &pa)) == ENOENT)
		;
	if (e)
		die("start_poll %d", e);
	do {
		if (cx->wr_id != (uint64_t)(6000 + got) || cx->status != IBV_WC_SUCCESS)
			die("extended CQE %d: wr_id %llu status %d", got, (unsigned long long)cx->wr_id, cx->status);
		got++;
	} while (got < 3 && (e = ibv_next_poll(cx)) == 0);
	ibv_end_poll(cx);
	if (got != 3)
		die("the resized extended CQ gave %d of 3 completions at once", got);
	if (ibv_destroy_qp(qr) || ibv_destroy_qp(qu) || ibv_destroy_cq(ibv_cq_ex_to_cq(cx)))
		die("extended CQ teardown");
	if (ibv_destroy_qp(qs) || ibv_destroy_qp(qt) || ibv_destroy_srq(srq))
		die("teardown");
	puts("ok");
	return 0;
}
