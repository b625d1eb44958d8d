package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/inspect"
)

// TestRecordAgainstRxe runs the whole recording against the rxe guest
// into a temporary directory (SOFTROCE_RXE=1, root, tshark): the guest's
// CM must answer every MAD the codec builds as the recorder expects (REP,
// DREP, MRA then REP, REJ 8, SIDR_REP with the request echoed and Q_Key
// 0x01234567, udaddy's datagram to the QP a host SIDR_REP named), and
// every MAD of the new capture must decode.
func TestRecordAgainstRxe(t *testing.T) {
	if os.Getenv("SOFTROCE_RXE") != "1" || os.Geteuid() != 0 {
		t.Skip("no rdma_rxe VM: set SOFTROCE_RXE=1 and run as root")
	}
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Skip("tshark not installed")
	}
	dir := t.TempDir()
	if err := run(dir); err != nil {
		t.Fatal(err)
	}
	recs, err := inspect.Records(filepath.Join(dir, "rxe-cm.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range recs {
		if r.CM == nil {
			continue
		}
		if r.CM.Error != "" {
			t.Errorf("frame %d: %s", r.Frame, r.CM.Error)
		}
		seen[r.CM.Message]++
	}
	for _, a := range []mad.AttrID{mad.AttrREQ, mad.AttrREP, mad.AttrRTU, mad.AttrDREQ, mad.AttrDREP, mad.AttrREJ,
		mad.AttrSIDRREQ, mad.AttrSIDRREP} {
		if seen[a.String()] == 0 {
			t.Errorf("no %v in the capture (%v)", a, seen)
		}
	}
	t.Logf("CM MADs recorded: %v", seen)
}
