package memreg

import (
	"math/bits"
	"strconv"
	"strings"
)

// Access is a set of memory access rights. Values equal enum
// ibv_access_flags.
type Access uint32

// Access rights.
const (
	AccessLocalWrite      Access = 1 << 0 // IBV_ACCESS_LOCAL_WRITE: receives and READ responses may write
	AccessRemoteWrite     Access = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead      Access = 1 << 2 // IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic    Access = 1 << 3 // IBV_ACCESS_REMOTE_ATOMIC
	AccessMWBind          Access = 1 << 4 // IBV_ACCESS_MW_BIND
	AccessZeroBased       Access = 1 << 5 // IBV_ACCESS_ZERO_BASED: VAs are offsets from 0
	AccessFlushGlobal     Access = 1 << 8 // IBV_ACCESS_FLUSH_GLOBAL
	AccessFlushPersistent Access = 1 << 9 // IBV_ACCESS_FLUSH_PERSISTENT
)

// accessSupported is every flag a registration may carry.
const accessSupported = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic |
	AccessMWBind | AccessZeroBased | AccessFlushGlobal | AccessFlushPersistent

var accessNames = [...]string{
	0: "LOCAL_WRITE", 1: "REMOTE_WRITE", 2: "REMOTE_READ", 3: "REMOTE_ATOMIC",
	4: "MW_BIND", 5: "ZERO_BASED", 6: "ON_DEMAND", 7: "HUGETLB",
	8: "FLUSH_GLOBAL", 9: "FLUSH_PERSISTENT",
}

// String lists the flags with the libibverbs names minus IBV_ACCESS_, e.g.
// "LOCAL_WRITE|REMOTE_READ"; "0" for none; unknown bits in hex.
func (a Access) String() string {
	if a == 0 {
		return "0"
	}
	var b strings.Builder
	for r := a; r != 0; r &= r - 1 {
		i := bits.TrailingZeros32(uint32(r))
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		if i < len(accessNames) {
			b.WriteString(accessNames[i])
		} else {
			b.WriteString("0x" + strconv.FormatUint(uint64(1)<<i, 16))
		}
	}
	return b.String()
}
