// Package rc is the Reliable Connection transport: for each QP a
// requester (segments work requests into packets, assigns PSNs,
// retransmits go-back-N), a responder (checks PSNs, executes requests
// against registered memory, ACKs and NAKs, replays duplicates) and a
// completer (matches ACKs and responses to work requests and completes
// them in order), after IBTA vol. 1 ch. 9.7 and the behaviour of the
// kernel's rdma_rxe. The work requests it runs are package wr's.
//
// The same engine runs Unreliable Connection QPs (uc.go): RC's
// segmentation and memory placement without ACKs, retransmission or
// timers, sequenced by the rules of package transport/uc.
//
// The package does no I/O and reads no clock: an Engine is fed received
// packet batches and the current time, and hands back packet batches to
// send and the next time it wants to be woken. Driver runs an Engine on a
// nic.Link with real time; tests run it on simulated time.
package rc
