package rc

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/softroce/softroce/nic"
)

// Driver runs an Engine on a nic.Link in real time with two goroutines
// per device (not per QP): one receives batches, one runs timers and
// posted work. Both send what the engine produces.
type Driver struct {
	e    *Engine
	link nic.Link
	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
	smu  sync.Mutex // serialises Send on the link
	once sync.Once
	// Err is set if the link failed (other than by Close).
	errMu sync.Mutex
	err   error
}

// NewDriver starts running e on link.
func NewDriver(e *Engine, link nic.Link) *Driver {
	d := &Driver{e: e, link: link, wake: make(chan struct{}, 1), done: make(chan struct{})}
	e.mu.Lock()
	e.Wake = d.kick
	e.mu.Unlock()
	d.wg.Add(2)
	go d.recvLoop()
	go d.timerLoop()
	return d
}

func (d *Driver) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Kick asks the driver to run Progress soon (after posting work).
func (d *Driver) Kick() { d.kick() }

func (d *Driver) recvLoop() {
	defer d.wg.Done()
	batch := make([]nic.Packet, d.link.BatchSize())
	for i := range batch {
		batch[i].Buf = make([]byte, MaxPacket+64)
	}
	for {
		n, err := d.link.Recv(batch)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				d.setErr(err)
			}
			return
		}
		d.e.Receive(time.Now(), batch[:n])
		d.flush()
	}
}

func (d *Driver) timerLoop() {
	defer d.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.flush()
		next := d.e.NextDeadline()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t.Reset(wait)
		select {
		case <-d.done:
			return
		case <-d.wake:
		case <-t.C:
		}
	}
}

// flush sends everything the engine has to send.
func (d *Driver) flush() {
	d.smu.Lock()
	defer d.smu.Unlock()
	for {
		out, more := d.e.Progress(time.Now())
		if len(out) > 0 {
			for sent := 0; sent < len(out); {
				n, err := d.link.Send(out[sent:])
				if err != nil {
					// A failed send is a lost packet to RC: retransmission
					// recovers it, so count it and go on.
					d.setErr(err)
					break
				}
				sent += n
			}
		}
		d.e.Release(out)
		if !more {
			return
		}
	}
}

func (d *Driver) setErr(err error) {
	d.errMu.Lock()
	d.err = err
	d.errMu.Unlock()
}

// Err returns the last link error, if any.
func (d *Driver) Err() error {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	return d.err
}

// Close stops the driver and closes the link.
func (d *Driver) Close() error {
	var err error
	d.once.Do(func() {
		close(d.done)
		err = d.link.Close()
		d.wg.Wait()
	})
	return err
}
