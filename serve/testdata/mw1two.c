/* One type 1 window bound with ibv_bind_mw alternately on two QPs, many
 * times, without waiting between the calls: each call gives the window
 * ibv_inc_rkey of its key at once, and the daemon may run the two QPs'
 * binds in either order. Every bind completes successfully; after a bind
 * waited for alone, the peer WRITEs through mw->rkey into the range it
 * bound and the key before it is stale. Prints "ok". */
#include "pair.h"

static void want(struct pair *p, struct ibv_qp *qp, uint64_t id)
{
	struct ibv_wc wc = wait_wc(p, qp);
	if (wc.wr_id != id || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_BIND_MW)
		die("bind completion on QP %u: wr %llu status %s opcode %d, want wr %llu", qp->qp_num,
		    (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)id);
}

static void bind(struct ibv_qp *qp, struct ibv_mw *m, struct ibv_mr *mb, uint64_t addr, uint64_t id)
{
	struct ibv_mw_bind b = { .wr_id = id, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = { .mr = mb, .addr = addr, .length = 256,
						.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ } };
	uint32_t k = m->rkey;
	if (ibv_bind_mw(qp, m, &b) || m->rkey != ibv_inc_rkey(k))
		die("ibv_bind_mw %llu on QP %u: %s, rkey %#x from %#x", (unsigned long long)id, qp->qp_num, strerror(errno),
		    m->rkey, k);
}

int main(void)
{
	struct pair p;
	pair_open(&p);
	char *a = calloc(1, 4096), *b = calloc(1, 16384);
	struct ibv_mr *ma = ibv_reg_mr(p.pd, a, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mb = ibv_reg_mr(p.pd, b, 16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mw *m = ibv_alloc_mw(p.pd, IBV_MW_TYPE_1);
	if (!ma || !mb || !m)
		die("setup: %s", strerror(errno));
	uint64_t id = 1;
	for (int round = 0; round < 400; round++) {
		/* qa, qb, qa, qb: four binds in flight on two send queues. */
		for (int j = 0; j < 4; j++)
			bind(j & 1 ? p.qb : p.qa, m, mb, (uintptr_t)b, id + j);
		for (int j = 0; j < 4; j += 2) {
			want(&p, p.qa, id + j);
			want(&p, p.qb, id + j + 1);
		}
		id += 4;
		if (round % 20)
			continue;
		/* Alone, so it is the last to run: the window is now this bind's. */
		uint64_t off = (uint64_t)(round / 20) * 512;
		bind(round & 1 ? p.qb : p.qa, m, mb, (uintptr_t)b + off, id);
		want(&p, round & 1 ? p.qb : p.qa, id++);
		for (int i = 0; i < 256; i++)
			a[i] = (char)(round + i * 3);
		if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 256, (uintptr_t)b + off, m->rkey) != IBV_WC_SUCCESS ||
		    memcmp(b + off, a, 256))
			die("round %d: WRITE through rkey %#x", round, m->rkey);
	}
	/* The key of the bind before the last names no binding any more. */
	uint32_t last = m->rkey;
	bind(p.qb, m, mb, (uintptr_t)b, id);
	want(&p, p.qb, id);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, (uintptr_t)b, last) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE with the rkey of the previous binding succeeded");
	puts("ok");
	return 0;
}
