package serve

import (
	"testing"
)

// The AH and SRQ part of the protocol equals abi/c/softroce_proto.h.
func TestProtoUDMatchesHeader(t *testing.T) {
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
	matchHeader(t, "softroce_proto.h", want)
}
