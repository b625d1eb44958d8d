// Package rxevm runs the Linux kernel's rdma_rxe as a RoCEv2 peer: it builds
// a small guest (a Debian bookworm kernel and an initramfs with rdma_rxe,
// rdma-core's tools and perftest, all from Debian packages) and boots it
// under qemu with TCG, inside a network namespace of its own that is
// connected to the guest through a tap device.
//
// Build downloads and assembles the image once and caches it (see
// DefaultCacheDir) under a hash of the recipe and the package versions, so
// later runs only boot: about 10-25 s depending on host load, because qemu
// starts the uncompressed kernel through its PVH entry point. Boot starts a
// VM and returns when the guest's rxe0 port is ACTIVE. The guest runs a
// command server: Run executes a shell command and returns its output and
// exit status, Start runs a long-lived tool (a perftest server, the verbs
// agent of package conformance/agent) that Kill, KillAll or Close ends.
// CaptureTap records the frames on the tap as pcap.
//
// With Options.HostPrograms the guest also mounts the host's /usr and /etc
// read-only over virtio-9p and assembles a chroot at HostRoot from them:
// the application stacks the host has installed from Debian (UCX,
// libfabric, Open MPI, MPICH, qperf) then run in the guest, with Debian's
// own libibverbs and rxe provider, against rxe0 (InHostRoot wraps a
// command), and VM.SharedDir is a writable directory both sides see (the
// guest at GuestShareDir inside the chroot). The image stays small and needs no rebuild when the host
// installs a package; the cost is a slower first start of each program
// (9p under TCG), and the guest sees exactly the host's package versions.
//
// Addressing inside the VM's namespace is fixed: the host side of the tap
// is HostAddr (10.88.0.1/24), the guest's eth0 and rxe0's GID index 1 are
// GuestAddr (10.88.0.2/24). Host code reaches the guest with DialContext,
// Listen, ListenPacket or Do, which run on a thread switched into the
// namespace; host commands run there with HostCommand.
//
// Nothing is left behind: Close kills qemu and deletes the namespace (and
// with it the tap); qemu gets SIGKILL when the process that booted it dies;
// a watchdog process removes the namespace when that process dies without
// calling Close (go test -timeout, SIGKILL); and Boot first sweeps
// namespaces of dead processes (SweepStale).
//
// Host requirements: root, qemu-system-x86_64, apt-get (with a current
// package index), dpkg-deb, depmod and modprobe, iproute2's ip, and xz for
// the faster PVH boot (Debian: qemu-system-x86 kmod iproute2 xz-utils).
//
// The package lives in conformance/ because it is the conformance harness's
// peer: package cases boots it for `softroce conformance rxe` (RxeTarget),
// the verbs agent of package agent runs in it for the harness, and the
// commands record and recordcm capture rxe's traffic through it. The
// whole-system tests of e2e/interop boot the same guest as their test bed
// and import it from here; were it under e2e/, `softroce conformance` would
// import from the test tree.
package rxevm
