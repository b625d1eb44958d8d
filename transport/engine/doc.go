// Package engine is the transport engine of one device, shared by every
// transport service: the QP table, each QP's send queue (its WQE slots and
// the walk over them) and receive queue, SRQs, CQ completions, local work
// requests (LOCAL_INV, BIND_MW), the transmit batch, the timer set, QP
// state changes and the Driver that runs it all on a nic.Link. What the
// connected services share (a packet from the peer, segmentation opcodes,
// placing SEND and WRITE data) is connected.go.
//
// What differs per service is not here: each QP has a Service value, made
// by the constructor its service registered for the QP type, which holds
// that service's state of the QP and runs its requester, responder and
// completer. transport/rc, transport/uc and transport/ud each register
// theirs from an init function, so a program has a service as soon as it
// imports its package (verbs imports all three); this package imports
// none of them. The split follows rxe, whose rxe_req.c, rxe_resp.c and
// rxe_comp.c run over one rxe_qp.c and rxe_queue.c, and gVisor's netstack,
// one stack package with a package per transport protocol under
// transport/.
//
// The engine does no I/O and reads no clock: it is fed received packet
// batches and the current time, and hands back packet batches to send and
// the next time it wants to be woken. Driver runs it on a nic.Link with
// real time; tests run it on simulated time, on the harness of package
// transport/internal/enginetest that the tests of every service share. One
// mutex guards an Engine and all its QPs; the services run under it.
package engine
