package engine

import (
	"sync"

	"github.com/softroce/softroce/nic"
)

// What driver_test.go (package engine_test, which runs RC QPs) reaches
// of the driver's insides.

func NewDriverStopped(e *Engine, link nic.Link, cfg DriverConfig) *Driver {
	return newDriver(e, link, cfg)
}

func (d *Driver) Flush()                   { d.flush() }
func (d *Driver) BeginBatch()              { d.beginBatch() }
func (d *Driver) EndBatch()                { d.endBatch() }
func (d *Driver) Wakes() chan struct{}     { return d.wake }
func (d *Driver) ReceiveSide() *sync.Mutex { return &d.own }
func (d *Driver) PollSeq() uint64          { return d.pollSeq.Load() }

// RunRecvLoop runs the receive goroutine's loop on the caller's.
func (d *Driver) RunRecvLoop() {
	d.wg.Add(1)
	d.recvLoop()
}

// Doorbells is how many doorbells are unfinished and how many batches
// hold the driver's wake-ups back.
func (d *Driver) Doorbells() (left, held int) {
	d.e.mu.Lock()
	defer d.e.mu.Unlock()
	return d.e.doorbells, d.held
}
