package serve

import "testing"

// The resize part of the protocol equals abi/c/softroce_proto.h.
func TestProtoResizeMatchesHeader(t *testing.T) {
	want := map[string]int{
		"SR_OP_RESIZE_CQ": opResizeCQ, "SR_OP_RESIZE_SRQ": opResizeSRQ,
		"sizeof(struct sr_resize_cq)": sizeResizeCQ, "sizeof(struct sr_modify_srq)": sizeModifySRQ,
		"sizeof(struct sr_srq_resp)": sizeSRQResp,
	}
	matchHeader(t, "softroce_proto.h", want)
}
