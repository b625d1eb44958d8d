/* ibv_reg_mr_iova2 with an IOVA other than the address: the peer's WRITE
 * and READ addressed by the IOVA land at the right bytes, the owner's own
 * SGEs use the IOVA, and the buffer's address is outside the region.
 * Prints "ok". */
#include "pair.h"

int main(void)
{
	struct pair p;
	pair_open(&p);
	char *a = calloc(1, 8192), *b = calloc(1, 8192);
	const uint64_t iova = 0x100000000000ull; /* mapped nowhere in this process */
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *ma = ibv_reg_mr(p.pd, a, 8192, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mb = ibv_reg_mr_iova2(p.pd, b, 8192, iova, acc);
	if (!ma || !mb)
		die("reg_mr: %s", strerror(errno));
	if (mb->addr != b || mb->length != 8192)
		die("ibv_mr addr %p length %zu", mb->addr, mb->length);
	for (int i = 0; i < 8192; i++)
		a[i] = (char)(i * 5 + 3);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 3000, iova + 1000, mb->rkey) != IBV_WC_SUCCESS)
		die("WRITE at the IOVA");
	if (memcmp(b + 1000, a, 3000) || b[999] || b[4000])
		die("the WRITE did not land at the IOVA's bytes");
	memcpy(b + 6000, "read by iova", 12);
	if (rdma(&p, IBV_WR_RDMA_READ, ma, a + 7000, 12, iova + 6000, mb->rkey) != IBV_WC_SUCCESS ||
	    memcmp(a + 7000, "read by iova", 12))
		die("READ at the IOVA");
	/* The owner's receive SGE names the region by its IOVA too. */
	struct ibv_sge rs = { iova + 7000, 100, mb->lkey };
	struct ibv_recv_wr rw = { .wr_id = 5, .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_sge ss = { (uintptr_t)a, 50, ma->lkey };
	struct ibv_send_wr sw = { .wr_id = 6, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
			   *sbad;
	if (ibv_post_recv(p.qb, &rw, &rbad) || ibv_post_send(p.qa, &sw, &sbad))
		die("post");
	struct ibv_wc wc = wait_wc(&p, p.qa);
	if (wc.status != IBV_WC_SUCCESS)
		die("SEND: %s", ibv_wc_status_str(wc.status));
	wc = wait_wc(&p, p.qb);
	if (wc.status != IBV_WC_SUCCESS || wc.byte_len != 50 || memcmp(b + 7000, a, 50))
		die("receive at the IOVA: %s", ibv_wc_status_str(wc.status));
	/* The buffer's own address is not the region's. */
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 8, (uintptr_t)b + 100, mb->rkey) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE at the buffer's own address succeeded");
	pair_connect(&p);
	if (rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 16, iova + 8192 - 8, mb->rkey) != IBV_WC_REM_ACCESS_ERR)
		die("WRITE past the IOVA range succeeded");
	pair_connect(&p);
	/* The classic entry point, and a range that wraps, refused. */
	struct ibv_mr *mc = ibv_reg_mr_iova(p.pd, b, 4096, 0x2000, acc);
	if (!mc || rdma(&p, IBV_WR_RDMA_WRITE, ma, a, 10, 0x2000 + 20, mc->rkey) != IBV_WC_SUCCESS || memcmp(b + 20, a, 10))
		die("ibv_reg_mr_iova: %s", strerror(errno));
	errno = 0;
	if (ibv_reg_mr_iova2(p.pd, b, 8192, ~0ull - 100, acc) || errno != EINVAL)
		die("a wrapping IOVA range: errno %d, want EINVAL", errno);
	if (ibv_dereg_mr(mc) || ibv_dereg_mr(mb) || ibv_dereg_mr(ma))
		die("dereg");
	puts("ok");
	return 0;
}
