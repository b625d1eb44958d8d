package serve

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/abi"
)

// The Go side of the protocol equals abi/c/softroce_proto.h: a C program
// prints the header's sizes, offsets and codes, compared with ours.
func TestProtoMatchesHeader(t *testing.T) {
	want := map[string]int{
		"SR_PROTO_VERSION": protoVersion, "SR_MAX_MSG": maxMsg, "SR_MAX_EXTENTS": maxExtents, "SR_NAME_LEN": nameLen,
		"SR_OP_DESTROY_CHANNEL": opDestroyChannel, "SR_OP_HELLO": opHello, "SR_OP_REG_MR": opRegMR, "SR_OP_CREATE_QP": opCreateQP,
		"SR_OP_MODIFY_QP":       opModifyQP,
		"sizeof(struct sr_req)": sizeReq, "sizeof(struct sr_resp)": sizeResp, "sizeof(struct sr_handle)": sizeHandle,
		"sizeof(struct sr_hello_req)": sizeHello, "sizeof(struct sr_hello_resp)": sizeHelloResp, "sizeof(struct sr_dev_entry)": sizeDevEntry, "sizeof(struct sr_dev_attr)": sizeDevAttr,
		"sizeof(struct sr_port_attr)": sizePortAttr, "sizeof(struct sr_gid_req)": sizeGIDReq, "sizeof(struct sr_gid)": sizeGID,
		"sizeof(struct sr_reg_mr)": sizeRegMR, "sizeof(struct sr_extent)": sizeExtent, "sizeof(struct sr_mr_resp)": sizeMR,
		"sizeof(struct sr_create_cq)": sizeCreateCQ, "sizeof(struct sr_cq_resp)": sizeCQ, "sizeof(struct sr_create_qp)": sizeCreateQP,
		"sizeof(struct sr_qp_resp)": sizeQP, "sizeof(struct sr_qp_attr)": sizeQPAttr, "sizeof(struct sr_modify_qp)": sizeModifyQP,
		"sizeof(struct sr_send_wqe)": sizeSendWQE, "sizeof(struct sr_sge)": sizeSGE, "sizeof(struct sr_recv_wqe)": sizeRecvWQE,
		"offsetof(struct sr_reg_mr, nextent)": 24, "offsetof(struct sr_qp_resp, map_len)": 48, "offsetof(struct sr_qp_resp, token)": 72, "offsetof(struct sr_qp_attr, dgid)": 88,
		"offsetof(struct sr_qp_attr, max_send_wr)": 104, "offsetof(struct sr_send_wqe, num_sge)": 20,
		"offsetof(struct sr_send_wqe, remote_addr)": 32, "offsetof(struct sr_send_wqe, invalidate_rkey)": 56,
		"offsetof(struct sr_cq_resp, map_len)": 8,
		"SR_PAGE":                              pageSize, "SR_QP_SQ_PROD": offSQProd, "SR_QP_SQ_CONS": offSQCons, "SR_QP_RQ_PROD": offRQProd, "SR_QP_RQ_CONS": offRQCons,
		"SR_QP_SLEEPING": offSleeping, "SR_QP_ERROR": offQPError, "SR_CQ_PROD": offCQProd, "SR_CQ_CONS": offCQCons,
		"SR_CQ_ARMED": offCQArmed, "SR_CQ_OVERRUN": offCQOverrun, "SR_CQE_SIZE": cqeSize, "sizeof(struct sr_async_event)": 8,
	}
	matchHeader(t, "softroce_proto.h", want)
}

// matchHeader compiles a C program that prints each expression of want
// (sizes, offsets and constants of the header) and compares the values
// with the Go side's.
func matchHeader(t *testing.T, header string, want map[string]int) {
	t.Helper()
	if m := abi.Missing(); m != "" {
		t.Skip("no C compiler: " + m)
	}
	exprs := make([]string, 0, len(want))
	for e := range want {
		exprs = append(exprs, e)
	}
	sort.Strings(exprs)
	var src strings.Builder
	fmt.Fprintf(&src, "#include <stdio.h>\n#include <stddef.h>\n#include \"%s\"\nint main(void) {\n", header)
	for _, e := range exprs {
		fmt.Fprintf(&src, "\tprintf(\"%%ld\\n\", (long)(%s));\n", e)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	c := filepath.Join(dir, "p.c")
	if err := writeFile(c, src.String()); err != nil {
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
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(exprs) {
		t.Fatalf("the program printed %d values for %d expressions", len(lines), len(exprs))
	}
	for i, e := range exprs {
		if n, err := strconv.Atoi(lines[i]); err != nil || n != want[e] {
			t.Errorf("%s: %s says %q, Go %d", e, header, lines[i], want[e])
		}
	}
}
