// Package ud is the Unreliable Datagram service: the UD QP's requester
// and receive path (qp.go), which the transport engine (transport/engine)
// runs for every QP of type UD, and the rules they follow that need no QP
// state (ud.go): the headers of a UD SEND (BTH + DETH [+ ImmDt]), the
// Q_Key rules on send and receive, the 40-byte GRH a UD receive buffer
// starts with, and the RoCEv2 UDP source port of an address handle.
//
// A UD send is one packet to the address handle of its work request,
// completed as it is handed out (no ACK, no retransmission); a UD receive
// is checked against the QP's Q_Key, lands behind the GRH and completes at
// once. The queues, SRQs, CQs and transmit batches are the engine's, as
// for every service. The service registers itself with the engine when
// the package is linked in (init in qp.go). It is a package of its own,
// as each service is, so that UD's paths sit beside the wire rules they
// follow (IBTA vol. 1 §9.8 and §10.2.5, kernel rdma_rxe for what a peer
// expects on RoCEv2), which are pure and tested on their own, and
// transport/rc holds RC alone.
package ud
