package afxdp

import "net"

var netErrClosed = net.ErrClosed
