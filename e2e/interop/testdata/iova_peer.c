/* An RC peer whose region is registered with ibv_reg_mr_iova2 at an IOVA
 * other than its address, driven over stdin/stdout by
 * TestABIIOVAAgainstRxe. It prints
 *   qpn=Q rkey=K iova=I addr=A gid=G
 * reads the peer's "QPN GID" line, connects (its send PSN 100, the
 * peer's 200) and prints "ready"; on "dump OFF LEN" it prints that part of
 * its buffer in hex; it ends at end of input. The buffer starts filled
 * with byte (i*3+1). */
#include "pair.h" /* serve/testdata's */

#define LEN (64 << 10)
#define IOVA 0x100000000000ull

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	struct ibv_cq *cq = c ? ibv_create_cq(c, 16, NULL, NULL, 0) : NULL;
	unsigned char *buf = malloc(LEN);
	if (!pd || !cq || !buf)
		die("setup: %s", strerror(errno));
	for (int i = 0; i < LEN; i++)
		buf[i] = (unsigned char)(i * 3 + 1);
	struct ibv_mr *mr = ibv_reg_mr_iova2(pd, buf, LEN, IOVA, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = mr ? ibv_create_qp(pd, &ia) : NULL;
	union ibv_gid gid;
	if (!qp || ibv_query_gid(c, 1, 0, &gid))
		die("qp: %s", strerror(errno));
	printf("qpn=%u rkey=%u iova=%llu addr=%llu gid=", qp->qp_num, mr->rkey, IOVA, (unsigned long long)(uintptr_t)buf);
	for (int i = 0; i < 16; i++)
		printf("%02x", gid.raw[i]);
	printf("\n");
	fflush(stdout);

	unsigned dqpn;
	char g[33];
	if (scanf("%u %32s", &dqpn, g) != 2 || strlen(g) != 32)
		die("peer line");
	union ibv_gid dgid;
	for (int i = 0; i < 16; i++)
		sscanf(g + 2 * i, "%2hhx", &dgid.raw[i]);
	rc_to_rts(qp, dqpn, &dgid, 200, 100, 16);
	printf("ready\n");
	fflush(stdout);
	unsigned off, len;
	while (scanf(" dump %u %u", &off, &len) == 2) {
		if (off > LEN || len > LEN - off)
			die("dump out of range");
		for (unsigned i = 0; i < len; i++)
			printf("%02x", buf[off + i]);
		printf("\n");
		fflush(stdout);
	}
	return 0;
}
