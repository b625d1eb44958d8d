package nic

// RawSender is implemented by links that can send a packet whose ICRC the
// caller has already written. Impairment uses it to corrupt a packet after
// its ICRC was computed, as a bad wire would, so that the receiver's ICRC
// check catches it; the conformance harness uses it to send packets with a
// deliberately wrong ICRC.
type RawSender interface {
	Link
	// PutICRC writes into the last four bytes of p the ICRC that Send
	// would write, for the headers the link will send p with.
	PutICRC(p *Packet) error
	// SendRaw is Send without computing the ICRC: the last four bytes of
	// each packet go on the wire as they are.
	SendRaw(pkts []Packet) (n int, err error)
}
