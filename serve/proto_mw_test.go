package serve

import "testing"

// The memory-window and IOVA part of the protocol equals
// abi/c/softroce_proto.h.
func TestProtoMWMatchesHeader(t *testing.T) {
	want := map[string]int{
		"SR_OP_ALLOC_MW": opAllocMW, "SR_OP_DEALLOC_MW": opDeallocMW, "SR_OP_REG_MR_IOVA": opRegMRIOVA,
		"sizeof(struct sr_reg_mr_iova)": sizeRegMRIOVA, "offsetof(struct sr_reg_mr_iova, iova)": sizeRegMR,
		"sizeof(struct sr_alloc_mw)": sizeAllocMW, "sizeof(struct sr_mw_resp)": sizeMWResp,
		"offsetof(struct sr_send_wqe, bind_lkey)": offWQEBindLKey, "offsetof(struct sr_send_wqe, bind_mw)": offWQEBindMW,
		"offsetof(struct sr_send_wqe, compare_add)": 40, "offsetof(struct sr_send_wqe, swap)": 48,
		"offsetof(struct sr_send_wqe, rkey)": 28,
	}
	matchHeader(t, "softroce_proto.h", want)
}
