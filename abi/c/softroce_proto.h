/*
 * The wire between libibverbs.so.1 (this directory) and the softroce daemon
 * (package serve). serve/proto.go mirrors every constant and offset here;
 * a Go test compiles a C program against this header and compares.
 *
 * Control: a SOCK_SEQPACKET Unix socket, one connection per ibv_context
 * (plus a short-lived one for ibv_get_device_list). Each message is one
 * request (struct sr_req + the op's body) answered by one response
 * (struct sr_resp + body). File descriptors ride as SCM_RIGHTS. All
 * integers are little-endian, fixed size; no pointers cross.
 *
 * Data: per QP a memfd the daemon creates (control page, send ring, recv
 * ring), per CQ a memfd (control page, CQE ring), both mapped MAP_SHARED by
 * the library and the daemon. Indices are free-running uint32 counters;
 * a ring's size is a power of two.
 */
#ifndef SOFTROCE_PROTO_H
#define SOFTROCE_PROTO_H

#include <stdint.h>

#define SR_PROTO_VERSION 4 /* 2: sr_qp_resp.token, sr_cm_req.qp_token, sr_hello_resp carries the network namespace; 3: the CM response carries a channel token, SR_OP_CM_MIGRATE_ID; 4: SR_OP_RDMA_VIEW */
#define SR_MAX_MSG 4096 /* largest request or response */
#define SR_MAX_EXTENTS 64 /* memfd pieces of one MR */
#define SR_NAME_LEN 64

enum sr_op {
	SR_OP_HELLO = 1,
	SR_OP_OPEN = 2,
	SR_OP_QUERY_DEVICE = 3,
	SR_OP_QUERY_PORT = 4,
	SR_OP_QUERY_GID = 5,
	SR_OP_ALLOC_PD = 6,
	SR_OP_DEALLOC_PD = 7,
	SR_OP_REG_MR = 8,
	SR_OP_DEREG_MR = 9,
	SR_OP_CREATE_CQ = 10,
	SR_OP_DESTROY_CQ = 11,
	SR_OP_CREATE_QP = 12,
	SR_OP_MODIFY_QP = 13,
	SR_OP_QUERY_QP = 14,
	SR_OP_DESTROY_QP = 15,
	SR_OP_CREATE_CHANNEL = 16,
	SR_OP_DESTROY_CHANNEL = 17,
	/* 18: STATUS (the daemon's JSON status, for softroce status) */
	/* UD address handles and SRQs: 19..39 */
	SR_OP_CREATE_AH = 19,
	SR_OP_DESTROY_AH = 20,
	SR_OP_CREATE_SRQ = 21,
	SR_OP_MODIFY_SRQ = 22,
	SR_OP_QUERY_SRQ = 23,
	SR_OP_DESTROY_SRQ = 24,
	SR_OP_RDMA_VIEW = 25, /* a page of the daemon's rdma views as JSON, for softroce rdma (not sent by the library) */
	/* rdma_cm: 40..69 (softroce_cm.h) */
	/* Memory windows and IOVA registration: 80..89 */
	SR_OP_ALLOC_MW = 80,
	SR_OP_DEALLOC_MW = 81,
	SR_OP_REG_MR_IOVA = 82,
	/* Resizing CQs and SRQs: 90..99 */
	SR_OP_RESIZE_CQ = 90,
	SR_OP_RESIZE_SRQ = 91,
};

struct sr_req {
	uint32_t op;
	uint32_t reserved;
};

struct sr_resp {
	int32_t err; /* 0 or a positive errno */
	uint32_t reserved;
};

/* HELLO: req sr_hello_req; resp sr_hello_resp + ndev x sr_dev_entry. */
struct sr_hello_req {
	uint32_t version;
	uint32_t reserved;
};
struct sr_hello_resp {
	uint32_t version;
	uint32_t ndev;
	/* The daemon's network namespace (st_dev and st_ino of its
	 * /proc/PID/ns/net; 0 when unknown): a client of another namespace
	 * refuses the daemon. */
	uint64_t net_dev, net_ino;
};
struct sr_dev_entry {
	char name[SR_NAME_LEN];
	uint64_t guid;
};

/* OPEN: req sr_handle (device index); resp empty + the doorbell eventfd
 * and the read end of the async event pipe, in that order. The daemon
 * writes one struct sr_async_event per event to the pipe. */
struct sr_handle {
	uint32_t handle;
	uint32_t reserved;
};

struct sr_async_event {
	uint32_t type; /* enum ibv_event_type */
	uint32_t handle; /* the QP's or CQ's handle; 0 for the device */
};

/* QUERY_DEVICE: resp sr_dev_attr. */
struct sr_dev_attr {
	uint64_t max_mr_size;
	uint64_t node_guid;
	uint32_t vendor_id, vendor_part_id, hw_ver;
	uint32_t max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd;
	uint32_t max_qp_rd_atom, max_qp_init_rd_atom;
	uint32_t max_srq, max_srq_wr, max_srq_sge, max_mw;
	uint32_t device_cap_flags, atomic_cap, phys_port_cnt;
	uint32_t reserved;
};

/* QUERY_PORT: req sr_handle (port number); resp sr_port_attr. */
struct sr_port_attr {
	uint32_t state, max_mtu, active_mtu; /* enum ibv_port_state, ibv_mtu */
	uint32_t gid_tbl_len, pkey_tbl_len, max_msg_sz;
	uint32_t link_mtu, reserved;
};

/* QUERY_GID: req sr_gid_req; resp sr_gid. */
struct sr_gid_req {
	uint32_t port, index;
};
struct sr_gid {
	uint8_t raw[16];
	uint32_t type; /* 1: RoCE v2 (enum ibv_gid_type_sysfs) */
	uint32_t reserved;
};

/* ALLOC_PD: resp sr_handle. DEALLOC_PD, DEREG_MR, DESTROY_CQ,
 * DESTROY_QP, QUERY_QP, DESTROY_CHANNEL: req sr_handle. */

/* REG_MR: req sr_reg_mr + nextent x sr_extent, one SCM_RIGHTS fd per
 * extent in order. The extents tile [addr rounded down to a page,
 * addr+length rounded up) in ascending order; each fd is a sealed memfd
 * (F_SEAL_SHRINK) holding that piece at offset off. resp sr_mr_resp. */
struct sr_reg_mr {
	uint32_t pd, access;
	uint64_t addr, length;
	uint32_t nextent, reserved;
};
struct sr_extent {
	uint64_t va, len, off;
};
struct sr_mr_resp {
	uint32_t handle, lkey, rkey, reserved;
};

/* REG_MR_IOVA: REG_MR with the VA the region has for peers, local SGEs
 * and window binds: req sr_reg_mr_iova + nextent x sr_extent, the fds as
 * for REG_MR; resp sr_mr_resp. */
struct sr_reg_mr_iova {
	struct sr_reg_mr h;
	uint64_t iova;
};

/* ALLOC_MW: req sr_alloc_mw; resp sr_mw_resp (the unbound window's
 * R_Key). DEALLOC_MW: req sr_handle (a bound window is unbound first).
 * Binds ride in the send ring (opcode IBV_WR_BIND_MW, see sr_send_wqe). */
struct sr_alloc_mw {
	uint32_t pd, type; /* enum ibv_mw_type */
};
struct sr_mw_resp {
	uint32_t handle, rkey;
};

/* CREATE_CQ: req sr_create_cq; resp sr_cq_resp + the ring memfd. */
struct sr_create_cq {
	uint32_t cqe;
	uint32_t channel; /* 0: none */
};
struct sr_cq_resp {
	uint32_t handle, size; /* size: CQE slots, a power of two */
	uint64_t map_len;
};

/* RESIZE_CQ: req sr_resize_cq; resp sr_cq_resp + a new ring memfd. The
 * daemon copies the completions the old ring holds into the new one at the
 * same indices, with SR_CQ_CONS, SR_CQ_OVERRUN and SR_CQ_ARMED (the old
 * ring's SR_CQ_ARMED is cleared), and writes only the new ring from then
 * on. Refused (EINVAL) below the completions held. */
struct sr_resize_cq {
	uint32_t handle, cqe;
};

/* CREATE_QP: req sr_create_qp; resp sr_qp_resp + the rings memfd. */
struct sr_create_qp {
	uint32_t pd, send_cq, recv_cq, qp_type;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge;
	uint32_t max_inline, sq_sig_all;
	/* Appended: the SRQ the QP takes its receives from (0: none). The
	 * daemon also accepts the 40-byte body without them. */
	uint32_t srq, reserved;
};
struct sr_qp_resp {
	uint32_t handle, qpn;
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
	uint32_t sq_size, rq_size, sq_stride, rq_stride, reserved;
	uint64_t map_len, sq_off, rq_off;
	/* Random: what ATTACH_QP (softroce_cm.h) must show to take the QP.
	 * librdmacm gets it from softroce_qp_token(). */
	uint64_t token;
};

/* softroce_qp_token is libibverbs' private export (version node
 * SOFTROCE_PRIVATE_1, outside the distribution's table) through which
 * softroce's librdmacm reads a QP's token: 0, or -1 with errno EINVAL. */
struct ibv_qp;
int softroce_qp_token(struct ibv_qp *qp, uint64_t *token);

/* MODIFY_QP: req sr_modify_qp. QUERY_QP: resp sr_qp_attr. Field meanings
 * as struct ibv_qp_attr; path_mtu is enum ibv_mtu; mask is
 * enum ibv_qp_attr_mask. */
struct sr_qp_attr {
	uint32_t qp_state, cur_state, path_mtu, qp_access_flags;
	uint32_t rq_psn, sq_psn, dest_qp_num, flow_label;
	uint32_t sgid_index, hop_limit, traffic_class, sl;
	uint32_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
	uint32_t max_rd_atomic, max_dest_rd_atomic, port_num, pkey_index;
	uint32_t is_global, qkey;
	uint8_t dgid[16];
	uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
	uint32_t reserved;
};
struct sr_modify_qp {
	uint32_t handle, mask;
	struct sr_qp_attr attr;
};

/* CREATE_AH: req sr_create_ah (struct ibv_ah_attr; RoCE needs
 * is_global); resp sr_handle. DESTROY_AH: req sr_handle. */
struct sr_create_ah {
	uint32_t pd, is_global, sgid_index, flow_label;
	uint32_t hop_limit, traffic_class, sl, port_num;
	uint8_t dgid[16];
};

/* CREATE_SRQ: req sr_create_srq; resp sr_srq_resp + the ring memfd (a
 * control page with SR_SRQ_PROD/SR_SRQ_CONS/SR_QP_SLEEPING/SR_QP_ERROR,
 * then size x stride receive WQEs at rq_off, struct sr_recv_wqe each).
 * MODIFY_SRQ: req sr_modify_srq (mask: enum ibv_srq_attr_mask).
 * QUERY_SRQ: req sr_handle; resp sr_srq_attr. DESTROY_SRQ: sr_handle.
 * The limit event is IBV_EVENT_SRQ_LIMIT_REACHED with the SRQ's handle.
 * RESIZE_SRQ: req sr_modify_srq with IBV_SRQ_MAX_WR in mask; resp
 * sr_srq_resp + a new ring memfd holding the WQEs not yet taken at the
 * same indices (MODIFY_SRQ refuses IBV_SRQ_MAX_WR: it sends no ring). */
struct sr_create_srq {
	uint32_t pd, max_wr, max_sge, srq_limit;
};
struct sr_srq_resp {
	uint32_t handle, srqn, max_wr, max_sge;
	uint32_t size, stride;
	uint64_t map_len, rq_off;
};
struct sr_modify_srq {
	uint32_t handle, mask, max_wr, srq_limit;
};
struct sr_srq_attr {
	uint32_t max_wr, max_sge, srq_limit, reserved;
};

/* CREATE_CHANNEL: resp sr_handle + the read end of a pipe. The daemon
 * writes a CQ's handle (uint32) to it when an armed CQ gets a CQE. */

/* ---- shared memory ---- */

#define SR_PAGE 4096

/* QP control page: each index on its own cache line. */
#define SR_QP_SQ_PROD 0 /* written by the library */
#define SR_QP_SQ_CONS 64 /* written by the daemon */
#define SR_QP_RQ_PROD 128
#define SR_QP_RQ_CONS 192
#define SR_QP_SLEEPING 256 /* daemon: 1 = ring the doorbell after posting */
#define SR_QP_ERROR 260 /* daemon: nonzero once it put the QP in ERR for a bad WQE */
/* SRQ control page: the receive ring's indices where a QP has its own. */
#define SR_SRQ_PROD SR_QP_RQ_PROD
#define SR_SRQ_CONS SR_QP_RQ_CONS

/* Send WQE: this header, then num_sge x sr_sge or inline_len bytes.
 * IBV_WR_BIND_MW: rkey is the window's new R_Key, invalidate_rkey its
 * current one, remote_addr/compare_add/swap the bound range's address,
 * length and access flags, bind_lkey the region's L_Key (0: unbind), and
 * bind_mw the window's handle when ibv_bind_mw (a type 1 window) posted
 * it, 0 for a work request (type 2). */
struct sr_send_wqe {
	uint64_t wr_id;
	uint32_t opcode; /* enum ibv_wr_opcode */
	uint32_t send_flags; /* enum ibv_send_flags */
	uint8_t imm_data[4]; /* __be32 as in struct ibv_send_wr */
	uint32_t num_sge;
	uint32_t inline_len;
	uint32_t rkey;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t invalidate_rkey;
	uint32_t bind_lkey;
	/* Appended: UD sends (struct ibv_send_wr's wr.ud); 0 on RC and UC. */
	uint32_t ah; /* the AH's handle */
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t bind_mw;
};
struct sr_sge {
	uint64_t addr;
	uint32_t length, lkey;
};
/* Receive WQE: this header, then num_sge x sr_sge. */
struct sr_recv_wqe {
	uint64_t wr_id;
	uint32_t num_sge, reserved;
};

/* CQ control page. */
#define SR_CQ_PROD 0 /* written by the daemon */
#define SR_CQ_CONS 64 /* written by the library */
#define SR_CQ_ARMED 128 /* library: 1 any, 2 solicited; daemon clears on firing */
#define SR_CQ_OVERRUN 192 /* daemon: nonzero after a CQE found the ring full */
#define SR_CQE_SIZE 64 /* a struct ibv_wc in each slot, then padding */

#endif
