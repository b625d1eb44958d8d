// Package cm is softroce's connection manager: the InfiniBand CM (IBTA
// vol. 1 chapter 12) over a device's QP1, with rdma_cm's semantics on top,
// written as a consumer of package verbs the way librdmacm sits on
// libibverbs. It interoperates with the Linux kernel's CM and rdma_cm
// (ucmatose, rping, udaddy and perftest -R on rdma_rxe).
//
// A program opens one CM per device and either listens or dials:
//
//	c, _ := cm.Open(dev, nil)                     // QP1 of dev, rdma_cm defaults
//	l, _ := c.Listen(cm.PortSpaceTCP, 7471)       // rdma_bind_addr + rdma_listen
//	req, _ := l.Next(ctx)                         // RDMA_CM_EVENT_CONNECT_REQUEST
//	conn, _ := req.Accept(ctx, qp, nil)           // QP to RTS, REP, wait for RTU
//
//	conn, err := c.Dial(ctx, addr, cm.PortSpaceTCP, 7471, qp, nil) // REQ, REP, QP to RTS, RTU
//	errors.Is(err, cm.ErrNoListener)              // REJ 8: nobody listens there
//	conn.Disconnect(ctx)                          // QP to ERR, DREQ, wait for DREP
//
// Dial and Accept take an RC QP in RESET or INIT and move it to RTS with
// the attributes the exchange settles (ConnParam, the peer's QPN and
// starting PSN, the path MTU, the ACK timeout), exactly as the kernel's
// ib_cm_init_qp_attr and librdmacm do. For UD (PortSpaceUDP), ResolveUD
// sends a SIDR_REQ and returns the remote QPN and Q_Key; a listener
// answers with ConnRequest.AcceptUD.
//
// Underneath is a deterministic IB CM engine that does no I/O of its own
// and reads no clock: every received MAD and every timer tick comes in
// with the time. The CM runs it with two goroutines per device (one
// receiving MADs, one sleeping until the next deadline), never one per
// connection. Malformed MADs, unknown attributes and messages for unknown
// comm IDs are counted (Stats) and dropped, or answered the way the kernel
// answers them; half-open connections are capped. docs/cm.md describes
// the states, timers, limits and counters.
package cm
