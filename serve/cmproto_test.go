package serve

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/abi"
)

// The CM ops and structs equal abi/c/softroce_cm.h, and the offsets the
// decoder reads are the header's.
func TestCMProtoMatchesHeader(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("no C compiler: " + m)
	}
	src := `#include <stdio.h>
#include <stddef.h>
#include "softroce_cm.h"
#define P(x) printf(#x " %ld\n", (long)(x))
int main(void) {
	P(SR_OP_CM_OPEN); P(SR_OP_CM_CREATE_ID); P(SR_OP_CM_DESTROY_ID); P(SR_OP_CM_BIND); P(SR_OP_CM_RESOLVE_ADDR);
	P(SR_OP_CM_RESOLVE_ROUTE); P(SR_OP_CM_LISTEN); P(SR_OP_CM_CONNECT); P(SR_OP_CM_ACCEPT); P(SR_OP_CM_REJECT);
	P(SR_OP_CM_DISCONNECT); P(SR_OP_CM_GET_EVENT); P(SR_OP_CM_ATTACH_QP); P(SR_OP_CM_DETACH_QP); P(SR_OP_CM_QUERY);
	P(SR_OP_CM_FIRST); P(SR_OP_CM_LAST); P(SR_CM_PRIVATE); P(SR_CM_NODEV);
	P(sizeof(struct sr_sockaddr)); P(sizeof(struct sr_cm_param)); P(sizeof(struct sr_cm_req)); P(sizeof(struct sr_cm_resp));
	P(sizeof(struct sr_cm_event)); P(offsetof(struct sr_sockaddr, addr)); P(offsetof(struct sr_cm_req, param));
	P(offsetof(struct sr_cm_req, private_len)); P(offsetof(struct sr_cm_req, src)); P(offsetof(struct sr_cm_req, dst));
	P(offsetof(struct sr_cm_req, private_data)); P(offsetof(struct sr_cm_req, qpn)); P(offsetof(struct sr_cm_event, src));
	P(offsetof(struct sr_cm_event, param)); P(offsetof(struct sr_cm_event, private_data));
	return 0;
}
`
	dir := t.TempDir()
	c := filepath.Join(dir, "p.c")
	if err := writeFile(c, src); err != nil {
		t.Fatal(err)
	}
	hdr, _ := filepath.Abs("../abi/c")
	bin := filepath.Join(dir, "p")
	if out, err := exec.Command("gcc", "-I"+hdr, "-o", bin, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"SR_OP_CM_OPEN": opCMOpen, "SR_OP_CM_CREATE_ID": opCMCreateID, "SR_OP_CM_DESTROY_ID": opCMDestroyID,
		"SR_OP_CM_BIND": opCMBind, "SR_OP_CM_RESOLVE_ADDR": opCMResolveAddr, "SR_OP_CM_RESOLVE_ROUTE": opCMResolveRoute,
		"SR_OP_CM_LISTEN": opCMListen, "SR_OP_CM_CONNECT": opCMConnect, "SR_OP_CM_ACCEPT": opCMAccept,
		"SR_OP_CM_REJECT": opCMReject, "SR_OP_CM_DISCONNECT": opCMDisconnect, "SR_OP_CM_GET_EVENT": opCMGetEvent,
		"SR_OP_CM_ATTACH_QP": opCMAttachQP, "SR_OP_CM_DETACH_QP": opCMDetachQP, "SR_OP_CM_QUERY": opCMQuery,
		"SR_OP_CM_FIRST": opCMFirst, "SR_OP_CM_LAST": opCMLast, "SR_CM_PRIVATE": cmPrivate, "SR_CM_NODEV": cmNoDev,
		"sizeof(struct sr_sockaddr)": sizeSockaddr, "sizeof(struct sr_cm_param)": sizeCMParam,
		"sizeof(struct sr_cm_req)": sizeCMReq, "sizeof(struct sr_cm_resp)": sizeCMResp, "sizeof(struct sr_cm_event)": sizeCMEvent,
		// the offsets decodeSockaddr, decodeCMReq and cmEvent.encode use
		"offsetof(struct sr_sockaddr, addr)": 8, "offsetof(struct sr_cm_req, param)": 24,
		"offsetof(struct sr_cm_req, private_len)": 32, "offsetof(struct sr_cm_req, src)": 40,
		"offsetof(struct sr_cm_req, dst)": 40 + sizeSockaddr, "offsetof(struct sr_cm_req, private_data)": 40 + 2*sizeSockaddr,
		"offsetof(struct sr_cm_req, qpn)": 12, "offsetof(struct sr_cm_event, src)": 32,
		"offsetof(struct sr_cm_event, param)": 32 + 2*sizeSockaddr, "offsetof(struct sr_cm_event, private_data)": 32 + 2*sizeSockaddr + sizeCMParam,
	}
	got := 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(l, ' ')
		name, v := l[:i], l[i+1:]
		n, _ := strconv.Atoi(v)
		w, ok := want[name]
		if !ok {
			t.Errorf("%s: not compared", name)
			continue
		}
		got++
		if n != w {
			t.Errorf("%s: header %d, Go %d", name, n, w)
		}
	}
	if got != len(want) {
		t.Errorf("compared %d of %d", got, len(want))
	}
}

// FuzzCMRequest: any CM request body decodes without a panic.
func FuzzCMRequest(f *testing.F) {
	f.Add(make([]byte, sizeCMReq))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != sizeCMReq {
			return
		}
		decodeCMReq(b)
	})
}
