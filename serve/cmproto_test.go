package serve

import (
	"testing"
)

// The CM ops and structs equal abi/c/softroce_cm.h, and the offsets the
// decoder reads are the header's.
func TestCMProtoMatchesHeader(t *testing.T) {
	want := map[string]int{
		"SR_OP_CM_OPEN": opCMOpen, "SR_OP_CM_CREATE_ID": opCMCreateID, "SR_OP_CM_DESTROY_ID": opCMDestroyID,
		"SR_OP_CM_BIND": opCMBind, "SR_OP_CM_RESOLVE_ADDR": opCMResolveAddr, "SR_OP_CM_RESOLVE_ROUTE": opCMResolveRoute,
		"SR_OP_CM_LISTEN": opCMListen, "SR_OP_CM_CONNECT": opCMConnect, "SR_OP_CM_ACCEPT": opCMAccept,
		"SR_OP_CM_REJECT": opCMReject, "SR_OP_CM_DISCONNECT": opCMDisconnect, "SR_OP_CM_GET_EVENT": opCMGetEvent,
		"SR_OP_CM_ATTACH_QP": opCMAttachQP, "SR_OP_CM_DETACH_QP": opCMDetachQP, "SR_OP_CM_QUERY": opCMQuery, "SR_OP_CM_MIGRATE_ID": opCMMigrateID,
		"SR_OP_CM_FIRST": opCMFirst, "SR_OP_CM_LAST": opCMLast, "SR_CM_PRIVATE": cmPrivate, "SR_CM_NODEV": cmNoDev,
		"sizeof(struct sr_sockaddr)": sizeSockaddr, "sizeof(struct sr_cm_param)": sizeCMParam,
		"sizeof(struct sr_cm_req)": sizeCMReq, "sizeof(struct sr_cm_resp)": sizeCMResp, "sizeof(struct sr_cm_event)": sizeCMEvent,
		// the offsets decodeSockaddr, decodeCMReq and cmEvent.encode use
		"offsetof(struct sr_sockaddr, addr)": 8, "offsetof(struct sr_cm_req, param)": 24,
		"offsetof(struct sr_cm_req, private_len)": 32, "offsetof(struct sr_cm_req, src)": 40,
		"offsetof(struct sr_cm_req, dst)": 40 + sizeSockaddr, "offsetof(struct sr_cm_req, private_data)": 40 + 2*sizeSockaddr,
		"offsetof(struct sr_cm_req, qpn)": 12, "offsetof(struct sr_cm_req, qp_token)": 40 + 2*sizeSockaddr + cmPrivate,
		"offsetof(struct sr_cm_req, chan_token)": 40 + 2*sizeSockaddr + cmPrivate, "offsetof(struct sr_cm_resp, token)": sizeCMResp - 8, "offsetof(struct sr_cm_event, src)": 32,
		"offsetof(struct sr_cm_event, param)": 32 + 2*sizeSockaddr, "offsetof(struct sr_cm_event, private_data)": 32 + 2*sizeSockaddr + sizeCMParam,
	}
	matchHeader(t, "softroce_cm.h", want)
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
