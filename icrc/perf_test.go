package icrc

import (
	"hash/crc32"
	"os"
	"runtime"
	"syscall"
	"testing"
)

// threadCPU is the CPU time the calling OS thread has used.
func threadCPU() int64 {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD (Linux)
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// TestThroughputRatio measures BenchmarkICRC4K against BenchmarkCRC32IEEE4K
// in thread CPU time rather than wall time, so that other work on a busy
// machine does not skew the ratio. It only logs: timing assertions would
// be flaky. Run with SOFTROCE_PERF=1 go test -run ThroughputRatio -v.
func TestThroughputRatio(t *testing.T) {
	if os.Getenv("SOFTROCE_PERF") != "1" {
		t.Skip("set SOFTROCE_PERF=1 to measure the ICRC/crc32 throughput ratio")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fr := frame4K(t)
	ip, udp := fr[14:34], fr[34:]
	const n = 1000000
	var sink uint32
	measure := func(f func() uint32) float64 {
		best := 1e18
		for range 3 {
			t0 := threadCPU()
			for range n {
				sink ^= f()
			}
			if v := float64(threadCPU()-t0) / n; v < best {
				best = v
			}
		}
		return best
	}
	a := measure(func() uint32 { c, _ := IPv4(ip, udp); return c })
	s := measure(func() uint32 { return ipv4Sum(ip[:20:20], udp) }) // not contiguous: staged path
	c := measure(func() uint32 { return crc32.ChecksumIEEE(fr) })
	t.Logf("per %d-byte frame: ICRC %.0f ns (%.2f GB/s), staged ICRC %.0f ns, crc32 %.0f ns (%.2f GB/s); ICRC/crc32 throughput %.2f (staged %.2f)",
		len(fr), a, float64(len(fr))/a, s, c, float64(len(fr))/c, c/a, c/s)
	_ = sink
}
