package engine

import (
	"errors"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/wr"
)

// gather copies len(dst) bytes starting at byte off of the SGL into dst.
func Gather(mrs *memreg.Table, pd *memreg.PD, sgl []wr.SGE, off int, dst []byte) error {
	for _, s := range sgl {
		if len(dst) == 0 {
			return nil
		}
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, len(dst))
		if err := mrs.LocalRead(pd, s.LKey, s.Addr+uint64(off), dst[:n]); err != nil {
			return err
		}
		dst = dst[n:]
		off = 0
	}
	if len(dst) != 0 {
		return errShortSGL
	}
	return nil
}

// scatter copies src into the SGL starting at byte off.
func Scatter(mrs *memreg.Table, pd *memreg.PD, sgl []wr.SGE, off int, src []byte) error {
	for _, s := range sgl {
		if len(src) == 0 {
			return nil
		}
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, len(src))
		if err := mrs.LocalWrite(pd, s.LKey, s.Addr+uint64(off), src[:n]); err != nil {
			return err
		}
		src = src[n:]
		off = 0
	}
	if len(src) != 0 {
		return errShortSGL
	}
	return nil
}

var errShortSGL = errors.New("engine: data longer than the scatter/gather list")

// LocalErrStatus is the completion status of a work request whose own
// buffers could not be read or written: a bad lkey is the local
// protection error of IBV_WC_LOC_PROT_ERR, anything else a length error.
func LocalErrStatus(err error) cq.Status {
	if errors.Is(err, memreg.ErrLocalProtection) {
		return cq.LocProtErr
	}
	return cq.LocLenErr
}
