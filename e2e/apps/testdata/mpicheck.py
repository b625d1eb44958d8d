"""mpicheck.py: mpicheck.c's checks through mpi4py, for two ranks.

A ping-pong from 8 bytes to 1 MiB (powers of 4 from 8, and 1 MiB), every
byte compared; Allreduce (sum of integers, max of doubles, each element
checked); Put and Get in an MPI window (fence and lock epochs). Each rank
first prints its network namespace, SOFTROCE_SOCKET and its UCX_*, FI_*,
OMPI_MCA_* and MPIR_CVAR_* variables; rank 0 prints the figures and
"mpicheck.py: ok". A mismatch aborts the job.

usage: python3 mpicheck.py [ITERS]
"""
import array
import os
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
peer = 1 - rank
SEED = 251  # a prime: patterns of different sizes and offsets differ


def pattern(tag, size, it):
    """The size bytes of message (tag, it): a 251-byte seed, rotated."""
    seed = bytes((i * 7 + tag * 31 + it * 13) % 256 for i in range(SEED))
    rep = seed * (size // SEED + 2)
    off = (size + it) % SEED
    return rep[off:off + size]


def check(what, got, want):
    if bytes(got) != want:
        i = next(i for i in range(len(want)) if got[i] != want[i])
        sys.stderr.write("rank %d: MISMATCH %s size %d at byte %d: got 0x%02x want 0x%02x\n"
                         % (rank, what, len(want), i, got[i], want[i]))
        sys.stderr.flush()
        comm.Abort(3)


def print_env():
    ns = os.readlink("/proc/self/ns/net")
    print("rank %d netns %s softroce_socket %s" % (rank, ns, os.environ.get("SOFTROCE_SOCKET", "(none)")))
    for k, v in sorted(os.environ.items()):
        if k.startswith(("UCX_", "FI_", "OMPI_MCA_", "MPIR_CVAR_")):
            print("rank %d env %s=%s" % (rank, k, v))
    sys.stdout.flush()


def pingpong(iters):
    sizes = [8 * 4 ** k for k in range(9) if 8 * 4 ** k < 1 << 20] + [1 << 20]
    for size in sizes:
        buf = bytearray(size)
        n = max(2, iters // 4 if size >= 1 << 18 else iters)
        comm.Barrier()
        t0 = MPI.Wtime()
        for it in range(n):
            if rank == 0:
                comm.Send([pattern(0xa, size, it), MPI.BYTE], dest=peer, tag=1)
                buf[:] = bytes(size)
                comm.Recv([buf, MPI.BYTE], source=peer, tag=2)
                check("pingpong reply", buf, pattern(0xb, size, it))
            else:
                buf[:] = bytes(size)
                st = MPI.Status()
                comm.Recv([buf, MPI.BYTE], source=peer, tag=1, status=st)
                if st.Get_count(MPI.BYTE) != size:
                    sys.stderr.write("rank 1: MISMATCH pingpong count %d want %d\n" % (st.Get_count(MPI.BYTE), size))
                    comm.Abort(3)
                check("pingpong", buf, pattern(0xa, size, it))
                comm.Send([pattern(0xb, size, it), MPI.BYTE], dest=peer, tag=2)
        half = (MPI.Wtime() - t0) / n / 2
        if rank == 0:
            print("pingpong size %d iters %d latency_us %.1f bandwidth_MBps %.2f" % (size, n, half * 1e6, size / half / 1e6))
    sys.stdout.flush()


def allreduce():
    for n in (1, 1000, 65536):
        a = array.array("l", ((rank + 1) * 1000003 + i for i in range(n)))
        s = array.array("l", bytes(8 * n))
        d = array.array("d", ((i + 0.5) if rank == (i & 1) else -float(i) for i in range(n)))
        m = array.array("d", bytes(8 * n))
        t0 = MPI.Wtime()
        comm.Allreduce([a, MPI.LONG], [s, MPI.LONG], op=MPI.SUM)
        comm.Allreduce([d, MPI.DOUBLE], [m, MPI.DOUBLE], op=MPI.MAX)
        dt = MPI.Wtime() - t0
        if list(s) != [3 * 1000003 + 2 * i for i in range(n)] or list(m) != [i + 0.5 for i in range(n)]:
            sys.stderr.write("rank %d: MISMATCH allreduce count %d\n" % (rank, n))
            comm.Abort(3)
        if comm.allreduce(rank + 1, op=MPI.SUM) != 3:
            sys.stderr.write("rank %d: MISMATCH allreduce of objects\n" % rank)
            comm.Abort(3)
        if rank == 0:
            print("allreduce count %d sum+max checked time_us %.1f" % (n, dt * 1e6))
    sys.stdout.flush()


def window(maxsize):
    win = MPI.Win.Allocate(2 * maxsize, 1, comm=comm)
    mem = win.tomemory()
    size = 8
    while size <= maxsize:
        # Fence: both ranks put into the peer's [0, size) and get the
        # peer's own data from [maxsize, maxsize+size).
        mem[0:maxsize] = bytes(maxsize)
        mem[maxsize:maxsize + size] = pattern(0xd0 + rank, size, 0)
        win.Fence()
        t0 = MPI.Wtime()
        win.Put([pattern(0xc0 + rank, size, 0), MPI.BYTE], peer, target=(0, size, MPI.BYTE))
        win.Fence()
        tput = MPI.Wtime() - t0
        check("put (fence)", mem[0:size], pattern(0xc0 + peer, size, 0))
        local = bytearray(size)
        t0 = MPI.Wtime()
        win.Get([local, MPI.BYTE], peer, target=(maxsize, size, MPI.BYTE))
        win.Fence()
        tget = MPI.Wtime() - t0
        check("get (fence)", local, pattern(0xd0 + peer, size, 0))
        # Passive target: rank 0 alone, under a lock.
        comm.Barrier()
        if rank == 0:
            win.Lock(peer, MPI.LOCK_EXCLUSIVE)
            win.Put([pattern(0xe0, size, 1), MPI.BYTE], peer, target=(0, size, MPI.BYTE))
            win.Flush(peer)
            back = bytearray(size)
            win.Get([back, MPI.BYTE], peer, target=(0, size, MPI.BYTE))
            win.Unlock(peer)
            check("get after put (lock)", back, pattern(0xe0, size, 1))
        comm.Barrier()
        if rank == 1:
            win.Lock(rank, MPI.LOCK_SHARED)
            check("put (lock)", mem[0:size], pattern(0xe0, size, 1))
            win.Unlock(rank)
        comm.Barrier()
        if rank == 0:
            print("win size %d put+get checked put_us %.1f get_us %.1f put_MBps %.2f get_MBps %.2f"
                  % (size, tput * 1e6, tget * 1e6, size / tput / 1e6, size / tget / 1e6))
        size *= 16
    win.Free()
    sys.stdout.flush()


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    if comm.Get_size() != 2:
        sys.stderr.write("mpicheck.py: needs 2 ranks, has %d\n" % comm.Get_size())
        comm.Abort(2)
    for r in range(2):
        if r == rank:
            print_env()
        comm.Barrier()
    pingpong(iters)
    allreduce()
    window(1 << 20)
    comm.Barrier()
    if rank == 0:
        print("mpicheck.py: ok")
        sys.stdout.flush()


main()
