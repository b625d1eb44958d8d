/* Memory windows through the library: a type 1 window bound with
 * ibv_bind_mw, a type 2 one with an IBV_WR_BIND_MW work request and with
 * ibv_wr_bind_mw; the peer QP WRITEs and READs through their rkeys inside
 * the window, and gets a remote access error outside it, after a
 * LOCAL_INV, a SEND_WITH_INV or a dealloc. Prints "ok". */
#include "pair.h"

static void post_b(struct pair *p, struct ibv_send_wr *w)
{
	struct ibv_send_wr *bad;
	if (ibv_post_send(p->qb, w, &bad))
		die("post on qb: %s", strerror(errno));
}

static void want_b(struct pair *p, uint64_t id, enum ibv_wc_opcode op, enum ibv_wc_status st)
{
	struct ibv_wc wc = wait_wc(p, p->qb);
	if (wc.wr_id != id || wc.status != st || (st == IBV_WC_SUCCESS && wc.opcode != op))
		die("qb completion: wr %llu status %s opcode %d, want wr %llu %s opcode %d", (unsigned long long)wc.wr_id,
		    ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)id, ibv_wc_status_str(st), op);
}

int main(void)
{
	struct pair p;
	pair_open(&p);
	struct ibv_device_attr da;
	if (ibv_query_device(p.c, &da) || da.max_mw < 2 || !(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) ||
	    !(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B))
		die("query_device: max_mw %d caps %#x", da.max_mw, da.device_cap_flags);
	char *a = calloc(1, 16384), *b = calloc(1, 16384);
	struct ibv_mr *ma = ibv_reg_mr(p.pd, a, 16384, IBV_ACCESS_LOCAL_WRITE);
	/* The region grants no remote rights of its own: only windows do. */
	struct ibv_mr *mb = ibv_reg_mr(p.pd, b, 16384, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	if (!ma || !mb)
		die("reg_mr: %s", strerror(errno));
	for (int i = 0; i < 16384; i++)
		a[i] = (char)(i * 7 + 1);
	uint64_t w0 = (uintptr_t)b + 4096; /* windows: [w0, w0+4096) */
	int rw = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, w0, mb->rkey) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE with the region's own rkey succeeded");
	pair_connect(&p);

	/* Type 1: ibv_bind_mw gives the window a new rkey at once. */
	struct ibv_mw *m1 = ibv_alloc_mw(p.pd, IBV_MW_TYPE_1);
	if (!m1 || m1->type != IBV_MW_TYPE_1)
		die("alloc type 1: %s", strerror(errno));
	uint32_t k0 = m1->rkey;
	struct ibv_mw_bind bind = { .wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
				    .bind_info = { .mr = mb, .addr = w0, .length = 4096, .mw_access_flags = rw } };
	if (ibv_bind_mw(p.qb, m1, &bind) || m1->rkey != ibv_inc_rkey(k0))
		die("ibv_bind_mw: rkey %#x from %#x", m1->rkey, k0);
	want_b(&p, 11, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 1000, w0 + 100, m1->rkey) != IBV_WC_SUCCESS || memcmp(b + 4096 + 100, a, 1000))
		die("WRITE through the type 1 window");
	if (b[4096 + 99] || b[4096 + 1100])
		die("the WRITE touched bytes around its range");
	if (rdma(&p, IBV_WR_RDMA_READ, ma, a + 8192, 1000, w0 + 100, m1->rkey) != IBV_WC_SUCCESS || memcmp(a + 8192, a, 1000))
		die("READ through the type 1 window");
	if (ibv_dereg_mr(mb) == 0)
		die("dereg of a region with a window bound succeeded");
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 100, w0 + 4000, m1->rkey) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE across the window's end succeeded");
	pair_connect(&p);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, w0 - 8, m1->rkey) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE before the window succeeded");
	pair_connect(&p);
	/* Binding again makes the earlier rkey stale. */
	uint32_t k1 = m1->rkey;
	bind.wr_id = 12;
	bind.bind_info.length = 64;
	if (ibv_bind_mw(p.qb, m1, &bind))
		die("rebind");
	want_b(&p, 12, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, w0, k1) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE with the rkey of the previous binding succeeded");
	pair_connect(&p);
	/* A bind outside the region completes in error. */
	bind.wr_id = 13;
	bind.bind_info.addr = (uintptr_t)b + 16000;
	bind.bind_info.length = 1000;
	if (ibv_bind_mw(p.qb, m1, &bind))
		die("post of a bad bind");
	want_b(&p, 13, 0, IBV_WC_MW_BIND_ERR);
	pair_connect(&p);
	/* The failed bind left the window as it was: the key before it works. */
	uint32_t k2 = ibv_inc_rkey(k1);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 64, w0, k2) != IBV_WC_SUCCESS || memcmp(b + 4096, a, 64))
		die("WRITE through the binding a failed bind left");
	if (ibv_dealloc_mw(m1))
		die("dealloc type 1");
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, w0, k2) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE through a deallocated window succeeded");
	pair_connect(&p);

	/* Type 2, bound by an IBV_WR_BIND_MW work request on qb. */
	struct ibv_mw *m2 = ibv_alloc_mw(p.pd, IBV_MW_TYPE_2);
	if (!m2 || m2->type != IBV_MW_TYPE_2)
		die("alloc type 2: %s", strerror(errno));
	if (ibv_bind_mw(p.qb, m2, &bind) != EINVAL)
		die("ibv_bind_mw accepted a type 2 window");
	uint32_t t1 = ibv_inc_rkey(m2->rkey);
	struct ibv_send_wr bw = { .wr_id = 21, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED };
	bw.bind_mw.mw = m2;
	bw.bind_mw.rkey = t1;
	bw.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mb, .addr = w0, .length = 4096, .mw_access_flags = rw };
	post_b(&p, &bw);
	want_b(&p, 21, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	m2->rkey = t1;
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a + 2000, 4096, w0, t1) != IBV_WC_SUCCESS || memcmp(b + 4096, a + 2000, 4096))
		die("WRITE through the type 2 window");
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 1, w0 + 4096, t1) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE past the type 2 window succeeded");
	pair_connect(&p);
	/* The window was bound to the QP that is gone: usable by none. */
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, w0, t1) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE through a type 2 window of a destroyed QP succeeded");
	pair_connect(&p);
	/* LOCAL_INV on it, then the rkey fails. */
	bw.wr_id = 22;
	bw.opcode = IBV_WR_LOCAL_INV;
	bw.invalidate_rkey = t1;
	post_b(&p, &bw);
	want_b(&p, 22, IBV_WC_LOCAL_INV, IBV_WC_SUCCESS);

	/* Bound again with ibv_wr_bind_mw on the new qb; the peer's
	 * SEND_WITH_INV invalidates it and the receive says which rkey. */
	uint32_t t2 = ibv_inc_rkey(t1);
	struct ibv_mw_bind_info bi = { .mr = mb, .addr = w0, .length = 4096, .mw_access_flags = rw };
	ibv_wr_start(p.qbx);
	p.qbx->wr_id = 23;
	p.qbx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(p.qbx, m2, t2, &bi);
	if (ibv_wr_complete(p.qbx))
		die("ibv_wr_bind_mw: %s", strerror(errno));
	want_b(&p, 23, IBV_WC_BIND_MW, IBV_WC_SUCCESS);
	m2->rkey = t2;
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a + 3000, 500, w0 + 3000, t2) != IBV_WC_SUCCESS || memcmp(b + 4096 + 3000, a + 3000, 500))
		die("WRITE through the rebound type 2 window");
	struct ibv_sge rs = { (uintptr_t)b, 64, mb->lkey };
	struct ibv_recv_wr rw_ = { .wr_id = 24, .sg_list = &rs, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(p.qb, &rw_, &rbad))
		die("post recv");
	struct ibv_sge ss = { (uintptr_t)a, 40, ma->lkey };
	struct ibv_send_wr sw = { .wr_id = 25, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
				  .send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = t2 }, *sbad;
	if (ibv_post_send(p.qa, &sw, &sbad))
		die("post SEND_WITH_INV");
	struct ibv_wc wc = wait_wc(&p, p.qa);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 25)
		die("SEND_WITH_INV: %s", ibv_wc_status_str(wc.status));
	wc = wait_wc(&p, p.qb);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 24 || wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_INV) ||
	    wc.invalidated_rkey != t2 || wc.byte_len != 40 || memcmp(b, a, 40))
		die("receive: status %s flags %#x invalidated %#x, want %#x", ibv_wc_status_str(wc.status), wc.wc_flags,
		    wc.invalidated_rkey, t2);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, w0, t2) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE after SEND_WITH_INV succeeded");
	pair_connect(&p);
	if (ibv_dealloc_mw(m2) || ibv_dereg_mr(mb) || ibv_dereg_mr(ma))
		die("teardown: %s", strerror(errno));
	ibv_destroy_qp(p.qa);
	ibv_destroy_qp(p.qb);
	ibv_destroy_cq(p.cqa);
	ibv_destroy_cq(p.cqb);
	if (ibv_dealloc_pd(p.pd) || ibv_close_device(p.c))
		die("close");
	puts("ok");
	return 0;
}
