package rxevm

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"
)

// TapCapture records every Ethernet frame that crosses the VM's tap device,
// in both directions, as a pcap stream. Unlike a capture inside a softroce
// endpoint, it sees the frames exactly as rdma_rxe put them on the wire
// (its IPv4 identification, UDP source port, ICRC), which is what reference
// captures of the kernel peer need.
type TapCapture struct {
	fd      int
	w       *pcapgo.Writer
	stop    atomic.Bool
	done    chan struct{}
	mu      sync.Mutex
	packets int
	err     error
}

// CaptureTap starts capturing the tap device into w (pcap, Ethernet link
// type, microsecond timestamps). Stop ends it.
func (vm *VM) CaptureTap(w io.Writer) (*TapCapture, error) {
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		return nil, fmt.Errorf("rxevm: capture %s: write pcap header: %w", vm.tap, err)
	}
	fd := -1
	// The packet socket and the interface index both belong to the VM's
	// namespace.
	err := vm.Do(func() error {
		ifi, err := net.InterfaceByName(vm.tap)
		if err != nil {
			return err
		}
		proto := htons(unix.ETH_P_ALL)
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind to %s: %w", vm.tap, err)
		}
		// A receive timeout lets the reader notice Stop.
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return fmt.Errorf("receive timeout: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rxevm: capture %s: %w", vm.tap, err)
	}
	c := &TapCapture{fd: fd, w: pw, done: make(chan struct{})}
	go c.loop()
	return c, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *TapCapture) loop() {
	defer close(c.done)
	buf := make([]byte, 65536)
	for !c.stop.Load() {
		n, _, err := unix.Recvfrom(c.fd, buf, unix.MSG_TRUNC)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			c.setErr(fmt.Errorf("rxevm: capture %s: %w", TapName, err))
			return
		}
		caplen := min(n, len(buf))
		ci := gopacket.CaptureInfo{Timestamp: time.Now(), CaptureLength: caplen, Length: n}
		if err := c.w.WritePacket(ci, buf[:caplen]); err != nil {
			c.setErr(fmt.Errorf("rxevm: capture %s: write: %w", TapName, err))
			return
		}
		c.mu.Lock()
		c.packets++
		c.mu.Unlock()
	}
}

func (c *TapCapture) setErr(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// Stop ends the capture and returns the number of frames written. Frames
// still in flight when Stop is called may be missed: let the traffic
// settle first.
func (c *TapCapture) Stop() (int, error) {
	c.stop.Store(true)
	<-c.done
	cerr := unix.Close(c.fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.packets, c.err
	}
	if cerr != nil {
		return c.packets, fmt.Errorf("rxevm: capture %s: close: %w", TapName, cerr)
	}
	return c.packets, nil
}
