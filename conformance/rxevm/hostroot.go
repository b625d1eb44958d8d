package rxevm

import (
	"path/filepath"
	"strings"
)

// HostRoot is where a guest booted with Options.HostPrograms has the
// host's programs: a chroot whose /usr and /etc are the host's.
const HostRoot = "/host"

// GuestShareDir is where the guest sees VM.SharedDir inside HostRoot
// (HostRoot+GuestShareDir outside the chroot).
const GuestShareDir = "/share"

// hostShares are the host directories shared read-only with the guest, by
// 9p mount tag. Debian has merged /usr, so /bin, /lib, /lib64 and /sbin
// are symlinks into it and /usr with /etc holds every installed package.
var hostShares = [][2]string{{"hostusr", "/usr"}, {"hostetc", "/etc"}}

// shareTag is the writable share: VM.SharedDir.
const shareTag = "hostshare"

func hostRootDevices(shared string) []string {
	var args []string
	for i, s := range append(hostShares, [2]string{shareTag, shared}) {
		ro := ",readonly=on"
		if s[0] == shareTag {
			ro = ""
		}
		id := "fs" + string(rune('0'+i))
		args = append(args,
			"-fsdev", "local,id="+id+",path="+s[1]+",security_model=none"+ro,
			"-device", "virtio-9p-pci,fsdev="+id+",mount_tag="+s[0])
	}
	return args
}

// SharedDir is a host directory the guest (booted with HostPrograms) sees
// as GuestShareDir, writable from both sides and by every user: programs
// and files for the guest, a rendezvous directory both sides of a job
// use. It is removed with the VM.
func (vm *VM) SharedDir() string { return filepath.Join(vm.dir, "share") }

// hostRootHook runs at boot (after rxe0 exists) and assembles HostRoot.
// cache=loose: the shares are read-only and do not change under a test,
// and the guest (TCG) would otherwise ask the host for every lookup.
var hostRootHook = File{Path: "/etc/softroce/init.d/10-hostroot", Mode: 0o755, Data: []byte(`#!/bin/sh
r=` + HostRoot + `
mkdir -p $r/usr $r/etc $r/proc $r/sys $r/dev $r/tmp $r/run $r/root $r/var/tmp $r/home
for l in bin lib lib64 sbin; do ln -sf usr/$l $r/$l; done
ln -sf /run $r/var/run
` + mountShares() + `mkdir -p $r` + GuestShareDir + `
mount -t 9p -o trans=virtio,version=9p2000.L ` + shareTag + ` $r` + GuestShareDir + ` || echo "softroce-guest: mount ` + shareTag + ` failed"
mount -o bind /proc $r/proc
mount -o bind /sys $r/sys
mount -o bind /dev $r/dev
mount -t tmpfs -o mode=1777 tmpfs $r/tmp
mount -t tmpfs tmpfs $r/run
mount -t tmpfs tmpfs $r/root
mount -t tmpfs -o mode=1777 tmpfs $r/var/tmp
mkdir -p $r/dev/shm && mount -t tmpfs -o mode=1777 tmpfs $r/dev/shm
echo "softroce-guest: host programs under $r"
`)}

func mountShares() string {
	var b strings.Builder
	for _, s := range hostShares {
		b.WriteString("mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose " + s[0] + " $r" + s[1] +
			` || echo "softroce-guest: mount ` + s[0] + ` failed"` + "\n")
	}
	return b.String()
}

// InHostRoot wraps a guest shell command so that it runs in HostRoot, with
// the host's programs and libraries and the guest's kernel and rxe0.
// Memory registration pins pages: the limit is lifted as for the guest's
// own tools.
func InHostRoot(cmd string) string {
	return "chroot " + HostRoot + " /bin/sh -c " + shellQuote("ulimit -l unlimited; cd /tmp; "+cmd)
}
