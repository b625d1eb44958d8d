package verbs

// Batch runs f, which posts work requests (PostSend, PostRecv, on any of
// the device's QPs), and then sends the packets they produced on the
// caller's goroutine before it returns, instead of waking the device's
// transmit goroutine once per post. It is for a caller that posts on
// behalf of others in passes, such as a daemon moving work requests from
// its clients' rings: one hand-off less per message. f must not call
// Batch; completions f's work produces arrive as usual.
func (d *Device) Batch(f func()) { d.drv.Batch(f) }
