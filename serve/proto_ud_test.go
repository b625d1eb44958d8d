package serve

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/abi"
)

// The AH and SRQ part of the protocol equals abi/c/softroce_proto.h.
func TestProtoUDMatchesHeader(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("no C compiler: " + m)
	}
	src := `#include <stdio.h>
#include <stddef.h>
#include "softroce_proto.h"
#define P(x) printf(#x " %ld\n", (long)(x))
int main(void) {
	P(SR_OP_CREATE_AH); P(SR_OP_DESTROY_AH); P(SR_OP_CREATE_SRQ); P(SR_OP_MODIFY_SRQ); P(SR_OP_QUERY_SRQ); P(SR_OP_DESTROY_SRQ);
	P(sizeof(struct sr_create_ah)); P(sizeof(struct sr_create_srq)); P(sizeof(struct sr_srq_resp));
	P(sizeof(struct sr_modify_srq)); P(sizeof(struct sr_srq_attr)); P(sizeof(struct sr_create_qp));
	P(offsetof(struct sr_create_qp, srq)); P(offsetof(struct sr_create_ah, dgid));
	P(offsetof(struct sr_send_wqe, ah)); P(offsetof(struct sr_send_wqe, remote_qpn)); P(offsetof(struct sr_send_wqe, remote_qkey));
	P(offsetof(struct sr_srq_resp, size)); P(offsetof(struct sr_srq_resp, stride)); P(offsetof(struct sr_srq_resp, map_len));
	P(offsetof(struct sr_srq_resp, rq_off)); P(SR_SRQ_PROD); P(SR_SRQ_CONS);
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
		"SR_OP_CREATE_AH": opCreateAH, "SR_OP_DESTROY_AH": opDestroyAH, "SR_OP_CREATE_SRQ": opCreateSRQ,
		"SR_OP_MODIFY_SRQ": opModifySRQ, "SR_OP_QUERY_SRQ": opQuerySRQ, "SR_OP_DESTROY_SRQ": opDestroySRQ,
		"sizeof(struct sr_create_ah)": sizeCreateAH, "sizeof(struct sr_create_srq)": sizeCreateSRQ,
		"sizeof(struct sr_srq_resp)": sizeSRQResp, "sizeof(struct sr_modify_srq)": sizeModifySRQ,
		"sizeof(struct sr_srq_attr)": sizeSRQAttr, "sizeof(struct sr_create_qp)": sizeCreateQP,
		"offsetof(struct sr_create_qp, srq)": 40, "offsetof(struct sr_create_ah, dgid)": 32,
		"offsetof(struct sr_send_wqe, ah)": offWQEAH, "offsetof(struct sr_send_wqe, remote_qpn)": offWQERemQPN,
		"offsetof(struct sr_send_wqe, remote_qkey)": offWQERemQKey,
		"offsetof(struct sr_srq_resp, size)":        16, "offsetof(struct sr_srq_resp, stride)": 20,
		"offsetof(struct sr_srq_resp, map_len)": 24, "offsetof(struct sr_srq_resp, rq_off)": 32,
		"SR_SRQ_PROD": offRQProd, "SR_SRQ_CONS": offRQCons,
	}
	seen := 0
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(l, ' ')
		name, v := l[:i], l[i+1:]
		n, _ := strconv.Atoi(v)
		w, ok := want[name]
		if !ok {
			t.Errorf("no Go value for %s", name)
			continue
		}
		seen++
		if n != w {
			t.Errorf("%s: C %d, Go %d", name, n, w)
		}
	}
	if seen != len(want) {
		t.Errorf("compared %d of %d values", seen, len(want))
	}
}
