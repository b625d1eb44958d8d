// Package devsync runs a function under a verbs device's transport lock,
// for this module's tests and tools only.
//
// The transport reads and writes registered memory on the device's own
// goroutines. A verbs program learns that it may touch a buffer again from
// a completion, and the CQ orders the accesses; but a test that inspects
// the target buffer of a peer's RDMA WRITE (which completes nothing on the
// target) or reads counters mid-run has no such event, and the race
// detector rightly reports it. Running the access under the engine lock
// orders it. That is a testing need, not a verbs one, and a public
// Device method would let any program stall the device's datapath, so the
// hook lives here, where only packages of this module can reach it.
package devsync

// run is installed by package verbs, which cannot be imported from here
// (verbs imports the transports, which are below this package's users).
var run func(dev any, f func())

// Register installs the function Run calls. Package verbs calls it from
// its init.
func Register(r func(dev any, f func())) { run = r }

// Run calls f under the transport lock of dev, a *verbs.Device: after
// everything the device's engine did before and before anything it does
// next. f must not call verbs on that device.
func Run(dev any, f func()) { run(dev, f) }
