/*
 * mpicheck: two ranks, every byte checked. A ping-pong from 8 bytes to
 * 1 MiB (powers of 2), MPI_Allreduce (sum and max, checked element by
 * element) and one-sided MPI_Put/MPI_Get in an MPI_Win (fence and
 * passive-target epochs). It prints what it measured and, from rank 0,
 * "mpicheck: ok" when every check passed; a mismatch aborts the job.
 *
 * Each rank first prints its network namespace, whether it runs through
 * softroce (SOFTROCE_SOCKET) and every UCX_*, FI_*, OMPI_MCA_* and MPIR_CVAR_*
 * variable of its environment, so that a test can see the ranks run on two
 * hosts with no setting but their transport selection.
 *
 * usage: mpicheck [-n ITERS] [-m MAXBYTES] [-o] [-f BYTES]
 *   -o: the window checks only
 *   -f: before the window checks, one checked exchange of BYTES that is
 *       then freed: a large buffer the MPI library registered and its
 *       registration cache still holds when the window's memory (and, with
 *       Open MPI's osc ucx, a second UCX worker's buffers) is allocated
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static int rank;

static void fail(const char *what, size_t size, size_t off, unsigned got, unsigned want)
{
	fprintf(stderr, "rank %d: MISMATCH %s size %zu at byte %zu: got 0x%02x want 0x%02x\n", rank, what, size, off,
		got, want);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, 3);
}

/* pattern is the byte at offset i of message (tag, size, iter). */
static unsigned char pattern(unsigned tag, size_t size, int iter, size_t i)
{
	uint32_t x = (uint32_t)(i * 2654435761u) ^ (uint32_t)(size * 40503u) ^ (uint32_t)(iter * 977u) ^ (tag << 24);
	return (unsigned char)(x ^ (x >> 11) ^ (x >> 19));
}

static void fill(unsigned char *b, unsigned tag, size_t size, int iter)
{
	for (size_t i = 0; i < size; i++)
		b[i] = pattern(tag, size, iter, i);
}

static void check(const char *what, const unsigned char *b, unsigned tag, size_t size, int iter)
{
	for (size_t i = 0; i < size; i++) {
		unsigned char w = pattern(tag, size, iter, i);
		if (b[i] != w)
			fail(what, size, i, b[i], w);
	}
}

static void print_env(void)
{
	char ns[64] = "?";
	ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
	if (n > 0)
		ns[n] = 0;
	const char *sock = getenv("SOFTROCE_SOCKET");
	printf("rank %d netns %s softroce_socket %s\n", rank, ns, sock ? sock : "(none)");
	for (char **e = environ; *e; e++) {
		if (!strncmp(*e, "UCX_", 4) || !strncmp(*e, "FI_", 3) || !strncmp(*e, "OMPI_MCA_", 9) ||
		    !strncmp(*e, "MPIR_CVAR_", 10))
			printf("rank %d env %s\n", rank, *e);
	}
	fflush(stdout);
}

static void pingpong(int iters, size_t maxsize)
{
	int peer = 1 - rank;
	unsigned char *buf = malloc(maxsize);
	if (!buf) {
		perror("malloc");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	for (size_t size = 8; size <= maxsize; size *= 2) {
		int n = size >= (256 << 10) ? (iters + 3) / 4 : iters;
		if (n < 2)
			n = 2;
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (int it = 0; it < n; it++) {
			if (rank == 0) {
				fill(buf, 0xa, size, it);
				MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
				memset(buf, 0, size);
				MPI_Recv(buf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				check("pingpong reply", buf, 0xb, size, it);
			} else {
				memset(buf, 0, size);
				MPI_Status st;
				MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &st);
				int count;
				MPI_Get_count(&st, MPI_BYTE, &count);
				if ((size_t)count != size)
					fail("pingpong count", size, 0, (unsigned)count, (unsigned)size);
				check("pingpong", buf, 0xa, size, it);
				fill(buf, 0xb, size, it);
				MPI_Send(buf, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
			}
		}
		double dt = MPI_Wtime() - t0;
		/* The checks are inside the timing on both sides: the figures
		 * are of a checked exchange. */
		double half = dt / n / 2;
		if (rank == 0)
			printf("pingpong size %zu iters %d latency_us %.1f bandwidth_MBps %.2f\n", size, n, half * 1e6,
			       size / half / 1e6);
	}
	free(buf);
	fflush(stdout);
}

static void allreduce(void)
{
	static const int counts[] = {1, 1000, 65536};
	for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
		int n = counts[c];
		long *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
		double *din = malloc(n * sizeof *din), *dout = malloc(n * sizeof *dout);
		for (int i = 0; i < n; i++) {
			in[i] = (long)(rank + 1) * 1000003L + i;
			din[i] = rank == (i & 1) ? i + 0.5 : -(double)i;
		}
		double t0 = MPI_Wtime();
		MPI_Allreduce(in, out, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		MPI_Allreduce(din, dout, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
		double dt = MPI_Wtime() - t0;
		for (int i = 0; i < n; i++) {
			long want = 1000003L + 2 * 1000003L + 2L * i;
			if (out[i] != want) {
				fprintf(stderr, "rank %d: MISMATCH allreduce sum count %d at %d: got %ld want %ld\n", rank, n,
					i, out[i], want);
				MPI_Abort(MPI_COMM_WORLD, 3);
			}
			if (dout[i] != i + 0.5) {
				fprintf(stderr, "rank %d: MISMATCH allreduce max count %d at %d: got %g want %g\n", rank, n,
					i, dout[i], i + 0.5);
				MPI_Abort(MPI_COMM_WORLD, 3);
			}
		}
		if (rank == 0)
			printf("allreduce count %d sum+max checked time_us %.1f\n", n, dt * 1e6);
		free(in);
		free(out);
		free(din);
		free(dout);
	}
	fflush(stdout);
}

/* exchange sends size bytes from rank 0 to rank 1 and back, checked,
 * in a buffer freed afterwards. */
static void exchange(size_t size)
{
	unsigned char *b = malloc(size);
	if (!b) {
		perror("malloc");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	if (rank == 0) {
		fill(b, 0xf, size, 0);
		MPI_Send(b, (int)size, MPI_BYTE, 1, 3, MPI_COMM_WORLD);
		MPI_Recv(b, (int)size, MPI_BYTE, 1, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		check("exchange reply", b, 0xe, size, 0);
		printf("exchange size %zu checked\n", size);
	} else {
		MPI_Recv(b, (int)size, MPI_BYTE, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		check("exchange", b, 0xf, size, 0);
		fill(b, 0xe, size, 0);
		MPI_Send(b, (int)size, MPI_BYTE, 0, 4, MPI_COMM_WORLD);
	}
	free(b);
	fflush(stdout);
}

static void window(size_t maxsize)
{
	int peer = 1 - rank;
	unsigned char *base;
	MPI_Win win;
	/* Window: [0, maxsize) is written by the peer's MPI_Put, [maxsize,
	 * 2*maxsize) is the owner's own data for the peer's MPI_Get. */
	MPI_Win_allocate((MPI_Aint)(2 * maxsize), 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
	unsigned char *local = malloc(maxsize);
	for (size_t size = 8; size <= maxsize; size *= 16) {
		/* Active target (fence): both ranks put into and get from each
		 * other. */
		memset(base, 0, maxsize);
		fill(base + maxsize, 0xd0 + rank, size, 0);
		fill(local, 0xc0 + rank, size, 0);
		MPI_Win_fence(0, win);
		double t0 = MPI_Wtime();
		MPI_Put(local, (int)size, MPI_BYTE, peer, 0, (int)size, MPI_BYTE, win);
		MPI_Win_fence(0, win);
		double tput = MPI_Wtime() - t0;
		check("put (fence)", base, 0xc0 + peer, size, 0);
		memset(local, 0, size);
		t0 = MPI_Wtime();
		MPI_Get(local, (int)size, MPI_BYTE, peer, (MPI_Aint)maxsize, (int)size, MPI_BYTE, win);
		MPI_Win_fence(0, win);
		double tget = MPI_Wtime() - t0;
		check("get (fence)", local, 0xd0 + peer, size, 0);

		/* Passive target: rank 0 alone, under a lock, puts a new
		 * pattern and reads it back together with the owner's data. */
		MPI_Barrier(MPI_COMM_WORLD);
		if (rank == 0) {
			fill(local, 0xe0, size, 1);
			MPI_Win_lock(MPI_LOCK_EXCLUSIVE, peer, 0, win);
			MPI_Put(local, (int)size, MPI_BYTE, peer, 0, (int)size, MPI_BYTE, win);
			MPI_Win_flush(peer, win);
			memset(local, 0, size);
			MPI_Get(local, (int)size, MPI_BYTE, peer, 0, (int)size, MPI_BYTE, win);
			MPI_Win_unlock(peer, win);
			check("get after put (lock)", local, 0xe0, size, 1);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		if (rank == 1) {
			MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
			check("put (lock)", base, 0xe0, size, 1);
			MPI_Win_unlock(rank, win);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		if (rank == 0)
			printf("win size %zu put+get checked put_us %.1f get_us %.1f put_MBps %.2f get_MBps %.2f\n", size,
			       tput * 1e6, tget * 1e6, size / tput / 1e6, size / tget / 1e6);
	}
	free(local);
	MPI_Win_free(&win);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int iters = 10, only_win = 0, size;
	size_t maxsize = 1 << 20, freed = 0;
	MPI_Init(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-m") && i + 1 < argc)
			maxsize = strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "-o"))
			only_win = 1;
		else if (!strcmp(argv[i], "-f") && i + 1 < argc)
			freed = strtoul(argv[++i], NULL, 0);
	}
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2) {
		if (rank == 0)
			fprintf(stderr, "mpicheck: needs 2 ranks, has %d\n", size);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	/* One rank at a time, so that the lines do not interleave. */
	for (int r = 0; r < 2; r++) {
		if (r == rank)
			print_env();
		MPI_Barrier(MPI_COMM_WORLD);
	}
	if (!only_win) {
		pingpong(iters, maxsize);
		allreduce();
	}
	if (freed)
		exchange(freed);
	window(maxsize);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		printf("mpicheck: ok\n");
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
