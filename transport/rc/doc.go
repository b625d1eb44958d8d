// Package rc is the Reliable Connection transport: for each QP a
// requester (segments work requests into packets, assigns PSNs,
// retransmits go-back-N), a responder (checks PSNs, executes requests
// against registered memory, ACKs and NAKs, replays duplicates) and a
// completer (matches ACKs and responses to work requests and completes
// them in order), after IBTA vol. 1 ch. 9.7 and the behaviour of the
// kernel's rdma_rxe. The work requests it runs are package wr's.
//
// The paths run on the shared engine of package transport/engine, which
// holds the QP table, queues, SRQs, batches and timers and calls each QP's
// service value; RC's (rcQP, rc.go) holds the state of RC's three paths
// for its QP and registers with engine.Register when this package is
// linked in. This is the split of rxe, whose rxe_req.c, rxe_resp.c and
// rxe_comp.c run over one rxe_qp.c. The other services are packages of
// their own, transport/uc and transport/ud, so that this one holds RC
// alone and each service's rules sit beside the paths that follow them.
package rc
