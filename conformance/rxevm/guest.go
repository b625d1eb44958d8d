package rxevm

// initScript is PID 1 of the guest until it execs busybox init. The kernel
// hands every unrecognised "key=value" word of its command line to init as
// an environment variable; Boot passes the addresses and ports that way.
//
// The module order comes from modprobe --show-depends at build time: a
// hand-written order is fragile (rdma_rxe needs ib_core, ib_uverbs and
// udp_tunnel first; virtio_net needs net_failover).
const initScript = `#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo "softroce-guest: kernel $(uname -r), loading modules"
while read -r m; do
	insmod "$m" || echo "softroce-guest: insmod $m failed"
done < /etc/softroce/modules
ip link set lo up
ip link set eth0 mtu "${sr_mtu:-1500}" || echo "softroce-guest: eth0 mtu ${sr_mtu} failed"
ip addr add "${sr_addr:-10.88.0.2/24}" dev eth0
ip link set eth0 up
# The rxe device follows the netdev's addresses: GID index 1 becomes the
# IPv4-mapped GID once eth0 has its address.
rdma link add rxe0 type rxe netdev eth0 || echo "softroce-guest: rdma link add failed"
# Registered memory is pinned: lift the memlock limit for every tool.
ulimit -l unlimited
# Hooks shipped in extra initramfs archives.
for f in /etc/softroce/init.d/*; do
	[ -x "$f" ] && "$f"
done
# The command server: every TCP connection gets a shell reading its script
# from the socket (busybox nc forks one shell per connection with -ll).
cat > /etc/softroce/cmdserver <<EOT
#!/bin/sh
ulimit -l unlimited
cd /tmp
exec nc -ll -p ${sr_port:-7000} -e /bin/sh
EOT
chmod 755 /etc/softroce/cmdserver
echo "softroce-guest: ready for commands on port ${sr_port:-7000}"
exec /bin/busybox init
`

// inittab makes busybox init (which reaps orphans, unlike a shell as PID 1)
// keep the command server alive.
const inittab = `::respawn:/etc/softroce/cmdserver
`

// guestTools are the executables copied from the unpacked packages into
// the guest, by path inside the package tree.
var guestTools = []string{
	"usr/bin/ibv_devinfo", "usr/bin/ibv_devices", "usr/bin/ibv_rc_pingpong",
	"usr/bin/ibv_uc_pingpong", "usr/bin/ibv_ud_pingpong", "usr/bin/ibv_srq_pingpong",
	"usr/bin/ib_write_bw", "usr/bin/ib_read_bw", "usr/bin/ib_atomic_bw", "usr/bin/ib_send_bw",
	"usr/bin/ib_write_lat", "usr/bin/ib_read_lat", "usr/bin/ib_atomic_lat", "usr/bin/ib_send_lat",
	"usr/bin/rping", "usr/bin/ucmatose", "usr/bin/udaddy",
	"usr/bin/rdma", "bin/ip",
}

// guestModules are the modules whose dependency closure is loaded at boot.
var guestModules = []string{"crc32_generic", "virtio_pci", "virtio_net", "rdma_rxe", "rdma_ucm", "9pnet_virtio", "9p"}

// guestPackages are the Debian packages unpacked into the build tree, in
// addition to the kernel package that linux-image-amd64 depends on.
// Everything in the guest comes from these (libc included), so the image
// does not depend on what the build host has installed.
var guestPackages = []string{
	"busybox-static",
	"ibverbs-utils", "rdmacm-utils", "perftest",
	"libibverbs1", "ibverbs-providers", "librdmacm1", "libibumad3",
	"iproute2", "libnl-3-200", "libnl-route-3-200", "libpci3",
	"libc6", "libgcc-s1",
	// Libraries of iproute2 and libpci3.
	"libmnl0", "libbsd0", "libmd0", "libcap2", "libelf1", "libbpf1", "zlib1g", "libudev1",
}

// extraLibs are loaded with dlopen, so DT_NEEDED does not name them:
// glibc loads libgcc_s for thread cancellation (rping aborts without it).
var extraLibs = []string{"libgcc_s.so.1"}

// The rxe userspace provider, loaded by libibverbs after it reads
// /etc/libibverbs.d/rxe.driver.
const (
	rxeProvider   = "usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
	rxeDriverConf = "etc/libibverbs.d/rxe.driver"
	guestLibDir   = "usr/lib/x86_64-linux-gnu"
)
