// Package uc is the Unreliable Connection service: the UC QP's requester
// and responder (qp.go), which the transport engine (transport/engine)
// runs for every QP of type UC, and the rules of the service that differ
// from RC, as pure logic with no engine state (uc.go): which work
// requests a UC QP may post, the UC opcode of each segment, and the
// responder's receive sequencing (IBTA vol. 1 §9.8, kernel rdma_rxe's UC
// paths).
//
// UC has no acknowledgements: the requester assigns PSNs and a work
// request completes once its last packet is handed to the link; the
// responder checks PSNs and opcode sequence and, when a packet is missing,
// silently drops the rest of the message and starts again at the next
// FIRST or ONLY packet, whatever its PSN. What UC shares with RC (queues,
// segmentation opcodes, memory placement, completions) is the engine's
// (connected.go there). The service registers itself with the engine when
// the package is linked in (init in qp.go). It is a package of its own, as
// each service is, so that what UC does differently sits in one place
// beside the rules that decide it, and transport/rc holds RC alone.
package uc
