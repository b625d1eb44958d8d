package serve

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/abi"
)

// The Go side of the protocol equals abi/c/softroce_proto.h: a C program
// prints the header's sizes, offsets and codes, compared with ours.
func TestProtoMatchesHeader(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("no C compiler: " + m)
	}
	src := `#include <stdio.h>
#include <stddef.h>
#include "softroce_proto.h"
#define P(x) printf(#x " %ld\n", (long)(x))
int main(void) {
	P(SR_PROTO_VERSION); P(SR_MAX_MSG); P(SR_MAX_EXTENTS); P(SR_NAME_LEN); P(SR_OP_DESTROY_CHANNEL);
	P(SR_OP_HELLO); P(SR_OP_REG_MR); P(SR_OP_CREATE_QP); P(SR_OP_MODIFY_QP);
	P(sizeof(struct sr_req)); P(sizeof(struct sr_resp)); P(sizeof(struct sr_handle)); P(sizeof(struct sr_hello_req));
	P(sizeof(struct sr_dev_entry)); P(sizeof(struct sr_dev_attr)); P(sizeof(struct sr_port_attr));
	P(sizeof(struct sr_gid_req)); P(sizeof(struct sr_gid)); P(sizeof(struct sr_reg_mr)); P(sizeof(struct sr_extent));
	P(sizeof(struct sr_mr_resp)); P(sizeof(struct sr_create_cq)); P(sizeof(struct sr_cq_resp));
	P(sizeof(struct sr_create_qp)); P(sizeof(struct sr_qp_resp)); P(sizeof(struct sr_qp_attr));
	P(sizeof(struct sr_modify_qp)); P(sizeof(struct sr_send_wqe)); P(sizeof(struct sr_sge)); P(sizeof(struct sr_recv_wqe));
	P(offsetof(struct sr_reg_mr, nextent)); P(offsetof(struct sr_qp_resp, map_len)); P(offsetof(struct sr_qp_attr, dgid));
	P(offsetof(struct sr_qp_attr, max_send_wr)); P(offsetof(struct sr_send_wqe, num_sge)); P(offsetof(struct sr_send_wqe, remote_addr));
	P(offsetof(struct sr_send_wqe, invalidate_rkey)); P(offsetof(struct sr_cq_resp, map_len));
	P(SR_PAGE); P(SR_QP_SQ_PROD); P(SR_QP_SQ_CONS); P(SR_QP_RQ_PROD); P(SR_QP_RQ_CONS); P(SR_QP_SLEEPING); P(SR_QP_ERROR);
	P(SR_CQ_PROD); P(SR_CQ_CONS); P(SR_CQ_ARMED); P(SR_CQ_OVERRUN); P(SR_CQE_SIZE); P(sizeof(struct sr_async_event));
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
		"SR_PROTO_VERSION": protoVersion, "SR_MAX_MSG": maxMsg, "SR_MAX_EXTENTS": maxExtents, "SR_NAME_LEN": nameLen,
		"SR_OP_DESTROY_CHANNEL": opDestroyChannel, "SR_OP_HELLO": opHello, "SR_OP_REG_MR": opRegMR, "SR_OP_CREATE_QP": opCreateQP,
		"SR_OP_MODIFY_QP":       opModifyQP,
		"sizeof(struct sr_req)": sizeReq, "sizeof(struct sr_resp)": sizeResp, "sizeof(struct sr_handle)": sizeHandle,
		"sizeof(struct sr_hello_req)": sizeHello, "sizeof(struct sr_dev_entry)": sizeDevEntry, "sizeof(struct sr_dev_attr)": sizeDevAttr,
		"sizeof(struct sr_port_attr)": sizePortAttr, "sizeof(struct sr_gid_req)": sizeGIDReq, "sizeof(struct sr_gid)": sizeGID,
		"sizeof(struct sr_reg_mr)": sizeRegMR, "sizeof(struct sr_extent)": sizeExtent, "sizeof(struct sr_mr_resp)": sizeMR,
		"sizeof(struct sr_create_cq)": sizeCreateCQ, "sizeof(struct sr_cq_resp)": sizeCQ, "sizeof(struct sr_create_qp)": sizeCreateQP,
		"sizeof(struct sr_qp_resp)": sizeQP, "sizeof(struct sr_qp_attr)": sizeQPAttr, "sizeof(struct sr_modify_qp)": sizeModifyQP,
		"sizeof(struct sr_send_wqe)": sizeSendWQE, "sizeof(struct sr_sge)": sizeSGE, "sizeof(struct sr_recv_wqe)": sizeRecvWQE,
		"offsetof(struct sr_reg_mr, nextent)": 24, "offsetof(struct sr_qp_resp, map_len)": 48, "offsetof(struct sr_qp_attr, dgid)": 88,
		"offsetof(struct sr_qp_attr, max_send_wr)": 104, "offsetof(struct sr_send_wqe, num_sge)": 20,
		"offsetof(struct sr_send_wqe, remote_addr)": 32, "offsetof(struct sr_send_wqe, invalidate_rkey)": 56,
		"offsetof(struct sr_cq_resp, map_len)": 8,
		"SR_PAGE":                              pageSize, "SR_QP_SQ_PROD": offSQProd, "SR_QP_SQ_CONS": offSQCons, "SR_QP_RQ_PROD": offRQProd, "SR_QP_RQ_CONS": offRQCons,
		"SR_QP_SLEEPING": offSleeping, "SR_QP_ERROR": offQPError, "SR_CQ_PROD": offCQProd, "SR_CQ_CONS": offCQCons,
		"SR_CQ_ARMED": offCQArmed, "SR_CQ_OVERRUN": offCQOverrun, "SR_CQE_SIZE": cqeSize, "sizeof(struct sr_async_event)": 8,
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
