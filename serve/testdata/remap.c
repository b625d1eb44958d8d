/*
 * Memory unmapped while registered, and new memory mapped at the same
 * address and registered before the old MR is deregistered: what a
 * registration cache does when the program frees a buffer and malloc
 * hands the same addresses out again (UCX's rcache deregisters freed
 * regions later). As with the kernel's pinned pages, the new MR must be
 * the new memory: RDMA into it is seen by the program, RDMA from it reads
 * what the program wrote, and the old MR's dereg leaves it alone.
 * Prints "ok".
 */
#define _GNU_SOURCE
#include "pair.h"
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define LEN (4 * 4096)

static void check(const char *what, const unsigned char *b, unsigned char v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != v)
			die("%s: byte %zu is 0x%02x, want 0x%02x", what, i, b[i], v);
}

/* roundtrip WRITEs 'w' from src into the region at x (MR mx) and READs
 * it back into src after the program stored 'p' there. */
static void roundtrip(struct pair *p, const char *what, unsigned char *x, struct ibv_mr *mx, unsigned char *src,
		      struct ibv_mr *msrc)
{
	char w[128];
	memset(src, 'w', LEN);
	memset(x, 0, LEN);
	snprintf(w, sizeof(w), "%s: WRITE into it", what);
	if (rdma(p, IBV_WR_RDMA_WRITE, msrc, src, LEN, (uintptr_t)x, mx->rkey) != IBV_WC_SUCCESS)
		die("%s failed", w);
	check(w, x, 'w', LEN);
	memset(x, 'p', LEN);
	memset(src, 0, LEN);
	snprintf(w, sizeof(w), "%s: READ from it", what);
	if (rdma(p, IBV_WR_RDMA_READ, msrc, src, LEN, (uintptr_t)x, mx->rkey) != IBV_WC_SUCCESS)
		die("%s failed", w);
	check(w, src, 'p', LEN);
	/* And a READ into it, as MPI_Get lands in the program's buffer. */
	memset(src, 'r', LEN);
	memset(x, 0, LEN);
	snprintf(w, sizeof(w), "%s: READ into it", what);
	if (rdma(p, IBV_WR_RDMA_READ, mx, x, LEN, (uintptr_t)src, msrc->rkey) != IBV_WC_SUCCESS)
		die("%s failed", w);
	check(w, x, 'r', LEN);
}

int main(void)
{
	struct pair p;
	pair_open(&p);
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	unsigned char *src = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *msrc = ibv_reg_mr(p.pd, src, LEN, rw);
	/* Two pages more than the buffer, so that the old region's neighbours
	 * stay registered and mapped from the old memfd. */
	unsigned char *big = mmap(NULL, LEN + 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (src == MAP_FAILED || !msrc || big == MAP_FAILED)
		die("setup: %s", strerror(errno));
	unsigned char *x = big + 4096;
	struct ibv_mr *old = ibv_reg_mr(p.pd, big, LEN + 2 * 4096, rw);
	if (!old)
		die("register the first region: %s", strerror(errno));
	roundtrip(&p, "first region", x, old, src, msrc);

	/* Freed while registered, and new memory at the same address. */
	if (munmap(x, LEN))
		die("munmap: %s", strerror(errno));
	unsigned char *y = mmap(x, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (y != x)
		die("mmap at the freed address: %s", strerror(errno));
	memset(x, 'n', LEN);
	struct ibv_mr *mx = ibv_reg_mr(p.pd, x, LEN, rw);
	if (!mx)
		die("register the new memory: %s", strerror(errno));
	check("new memory after its registration", x, 'n', LEN);
	roundtrip(&p, "new memory, old MR alive", x, mx, src, msrc);

	/* The old MR's neighbour pages are still the old MR's. */
	memset(big, 'a', 4096);
	memset(src, 0, 4096);
	if (rdma(&p, IBV_WR_RDMA_READ, msrc, src, 4096, (uintptr_t)big, old->rkey) != IBV_WC_SUCCESS)
		die("READ the old MR's first page failed");
	check("old MR's first page", src, 'a', 4096);

	/* Deregistering the old MR leaves the new memory and its MR alone. */
	memset(x, 'k', LEN);
	if (ibv_dereg_mr(old))
		die("dereg the old MR: %s", strerror(errno));
	check("new memory after the old MR's dereg", x, 'k', LEN);
	check("old MR's first page after its dereg", big, 'a', 4096);
	roundtrip(&p, "new memory, old MR gone", x, mx, src, msrc);

	/* A fork still gives the child its own copy of the new memory. */
	memset(x, 'f', LEN);
	pid_t pid = fork();
	if (pid == 0) {
		int ok = x[LEN - 1] == 'f';
		memset(x, 'c', LEN);
		_exit(ok ? 0 : 3);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		die("the forked child failed: status 0x%x", st);
	check("new memory after fork", x, 'f', LEN);

	memset(x, 'z', LEN);
	if (ibv_dereg_mr(mx))
		die("dereg the new MR: %s", strerror(errno));
	check("new memory after its dereg", x, 'z', LEN);
	puts("ok");
	return 0;
}
