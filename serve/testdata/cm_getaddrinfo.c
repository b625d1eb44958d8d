/* rdma_getaddrinfo with neither node nor service (testdata of
 * TestCProgramCMGetaddrinfo): as librdmacm, the answer carries the hints'
 * addresses (libfabric's verbs provider resolves its endpoints so); a
 * source in the hints is kept when a node is resolved; nothing at all is
 * EINVAL. */
#include "cm_common.h"

int main(void)
{
	struct sockaddr_in dst, src;
	struct rdma_addrinfo h = { 0 }, *r;

	sin_of(&dst, "10.1.2.3", 4242);
	sin_of(&src, "10.1.2.4", 0);
	h.ai_family = AF_INET;
	h.ai_port_space = RDMA_PS_TCP;
	h.ai_dst_addr = (struct sockaddr *)&dst;
	h.ai_dst_len = sizeof(dst);
	h.ai_src_addr = (struct sockaddr *)&src;
	h.ai_src_len = sizeof(src);
	CHECK(rdma_getaddrinfo(NULL, NULL, &h, &r) == 0);
	CHECK(r->ai_dst_len == sizeof(dst) && memcmp(r->ai_dst_addr, &dst, sizeof(dst)) == 0);
	CHECK(r->ai_src_len == sizeof(src) && memcmp(r->ai_src_addr, &src, sizeof(src)) == 0);
	CHECK(r->ai_port_space == RDMA_PS_TCP && r->ai_family == AF_INET && !r->ai_next);
	rdma_freeaddrinfo(r);

	h.ai_dst_addr = NULL;
	h.ai_dst_len = 0;
	CHECK(rdma_getaddrinfo("10.1.2.5", "7000", &h, &r) == 0);
	CHECK(r->ai_dst_addr && ((struct sockaddr_in *)r->ai_dst_addr)->sin_port == htons(7000));
	CHECK(r->ai_src_len == sizeof(src) && memcmp(r->ai_src_addr, &src, sizeof(src)) == 0);
	rdma_freeaddrinfo(r);

	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &r) != 0 && errno == EINVAL);
	printf("ok\n");
	return 0;
}
