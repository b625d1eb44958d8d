/* The memfd route's rules, as docs/abi.md states them. Prints "ok". */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

int main(int argc, char **argv)
{
	(void)argc;
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c = l && l[0] ? ibv_open_device(l[0]) : NULL;
	struct ibv_pd *pd = c ? ibv_alloc_pd(c) : NULL;
	if (!pd)
		die("setup failed");
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

	/* A shared file mapping is refused: writes would stop reaching the file. */
	FILE *f = fopen(argv[1], "w+");
	if (!f || ftruncate(fileno(f), 8192))
		die("file");
	void *fm = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
	errno = 0;
	if (ibv_reg_mr(pd, fm, 8192, rw) || errno != EOPNOTSUPP)
		die("shared file mapping: errno %d, want EOPNOTSUPP", errno);

	/* Read-only memory is refused. */
	void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	errno = 0;
	if (ibv_reg_mr(pd, ro, 4096, 0) || errno != EOPNOTSUPP)
		die("read-only mapping: errno %d, want EOPNOTSUPP", errno);

	/* Two buffers on one page, each registered: both work, the page's
	 * contents stay, and the second reuses the first's memfd. */
	char *p = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (int i = 0; i < 3 * 4096; i++)
		p[i] = (char)i;
	struct ibv_mr *a = ibv_reg_mr(pd, p + 100, 200, rw);
	struct ibv_mr *b = ibv_reg_mr(pd, p + 1000, 5000, rw); /* pages 0 and 1 */
	if (!a || !b)
		die("overlapping registrations failed: %s", strerror(errno));
	for (int i = 0; i < 3 * 4096; i++)
		if (p[i] != (char)i)
			die("byte %d changed by registration", i);
	if (ibv_dereg_mr(a) || ibv_dereg_mr(b))
		die("dereg failed");
	/* Registering again after dereg works, and so does a zero length refusal. */
	if (!(a = ibv_reg_mr(pd, p, 3 * 4096, rw)) || ibv_dereg_mr(a))
		die("register again failed");
	errno = 0;
	if (ibv_reg_mr(pd, p, 0, rw) || errno != EINVAL)
		die("zero length: errno %d, want EINVAL", errno);
	/* Malloc'd memory and the stack register. */
	char stack[3000];
	void *h = malloc(1 << 20);
	if (!(a = ibv_reg_mr(pd, h, 1 << 20, rw)) || !(b = ibv_reg_mr(pd, stack, sizeof(stack), rw)))
		die("malloc or stack registration failed: %s", strerror(errno));
	ibv_dereg_mr(a);
	ibv_dereg_mr(b);

	/* fork: the child gets a private copy of registered memory, as Linux
	 * gives one of pinned pages; its writes do not reach the parent. */
	char *hb = malloc(100000);
	memset(hb, 'p', 100000);
	struct ibv_mr *hm = ibv_reg_mr(pd, hb, 100000, rw);
	if (!hm)
		die("register before fork: %s", strerror(errno));
	pid_t pid = fork();
	if (pid == 0) {
		int ok = hb[99999] == 'p';
		memset(hb, 'c', 100000);
		_exit(ok && hb[5] == 'c' ? 0 : 3);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st))
		die("the forked child failed: status 0x%x", st);
	for (int i = 0; i < 100000; i++)
		if (hb[i] != 'p')
			die("the child's write reached the parent at byte %d", i);
	ibv_dereg_mr(hm);
	ibv_dealloc_pd(pd);
	ibv_close_device(c);
	puts("ok");
	return 0;
}
