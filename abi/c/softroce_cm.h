/*
 * The connection-management part of the wire between the softroce
 * libraries and the daemon: what librdmacm.so.1 (rdmacm.c) sends.
 * serve/cmproto.go mirrors every constant and size here; a Go test
 * compiles a C program against this header and compares.
 *
 * An rdma_event_channel is one SOCK_SEQPACKET connection to the daemon
 * that starts with CM_OPEN; its cm_ids are handles valid on that
 * connection only. Every request is struct sr_req + struct sr_cm_req,
 * answered by struct sr_resp + struct sr_cm_resp (GET_EVENT: + struct
 * sr_cm_event). CM_OPEN's answer carries the read end of a pipe: the
 * daemon writes one byte to it per event it queues, so the channel's fd
 * is a real descriptor that poll/epoll on, and a read of one byte then
 * GET_EVENT takes one event. (The descriptor is one end of a socket
 * pair: the daemon takes back the bytes of events MIGRATE_ID moves.)
 */
#ifndef SOFTROCE_CM_H
#define SOFTROCE_CM_H

#include <stdint.h>

enum sr_cm_op {
	SR_OP_CM_OPEN = 40,
	SR_OP_CM_CREATE_ID = 41, /* ps, qp_type; resp id */
	SR_OP_CM_DESTROY_ID = 42, /* id */
	SR_OP_CM_BIND = 43, /* id, src; resp dev, src (the port chosen) */
	SR_OP_CM_RESOLVE_ADDR = 44, /* id, src (family 0: any), dst; event ADDR_RESOLVED */
	SR_OP_CM_RESOLVE_ROUTE = 45, /* id; event ROUTE_RESOLVED */
	SR_OP_CM_LISTEN = 46, /* id, backlog in ps */
	SR_OP_CM_CONNECT = 47, /* id, param; events ESTABLISHED, REJECTED, UNREACHABLE */
	SR_OP_CM_ACCEPT = 48, /* id, param; event ESTABLISHED (RC) */
	SR_OP_CM_REJECT = 49, /* id, private data */
	SR_OP_CM_DISCONNECT = 50, /* id; event DISCONNECTED */
	SR_OP_CM_GET_EVENT = 51, /* resp sr_cm_event, or EAGAIN */
	SR_OP_CM_ATTACH_QP = 52, /* id, qpn, qp_token: the daemon moves the QP to INIT (UD: RTS) */
	SR_OP_CM_DETACH_QP = 53, /* id */
	SR_OP_CM_QUERY = 54, /* id; resp dev, src, dst */
	/* id, chan_token: the id (and its queued events) moves to the channel
	 * of that token, a channel of the same process; resp id: its handle
	 * there */
	SR_OP_CM_MIGRATE_ID = 55,
};
#define SR_OP_CM_FIRST 40
#define SR_OP_CM_LAST 69

#define SR_CM_PRIVATE 256 /* room for any CM message's private data */
#define SR_CM_NODEV 0xffffffffu

/* An IPv4 or IPv6 socket address; port in host order. */
struct sr_sockaddr {
	uint16_t family; /* AF_INET, AF_INET6, 0: none */
	uint16_t port;
	uint32_t scope_id;
	uint8_t addr[16]; /* IPv4: the first 4 bytes */
};

struct sr_cm_param {
	uint8_t responder_resources, initiator_depth, flow_control, retry_count;
	uint8_t rnr_retry_count, srq, valid, reserved;
};

struct sr_cm_req {
	uint32_t id;
	uint32_t ps; /* CREATE_ID: enum rdma_port_space; LISTEN: backlog */
	uint32_t qp_type; /* CREATE_ID: enum ibv_qp_type */
	uint32_t qpn; /* ATTACH_QP; ACCEPT of UD: the QP answered with */
	uint32_t timeout_ms;
	uint32_t qkey; /* ACCEPT of UD */
	struct sr_cm_param param;
	uint32_t private_len;
	uint32_t reserved;
	struct sr_sockaddr src, dst;
	uint8_t private_data[SR_CM_PRIVATE];
	union {
		/* ATTACH_QP: the QP's token from CREATE_QP (sr_qp_resp.token);
		 * the daemon gives a QP only to its owner's uid showing it. */
		uint64_t qp_token;
		/* MIGRATE_ID: the new channel's token (its CM_OPEN's answer) */
		uint64_t chan_token;
	};
};

struct sr_cm_resp {
	uint32_t id;
	uint32_t dev; /* device index, SR_CM_NODEV when bound to no device */
	struct sr_sockaddr src, dst;
	uint64_t token; /* CM_OPEN: the channel's, for MIGRATE_ID */
};

struct sr_cm_event {
	uint32_t id; /* the cm_id; CONNECT_REQUEST: the new one */
	uint32_t event; /* enum rdma_cm_event_type */
	int32_t status;
	uint32_t listen_id; /* CONNECT_REQUEST: the listening id */
	uint32_t dev;
	uint32_t qp_num; /* CONNECT_REQUEST: the peer's QP; UD ESTABLISHED: the remote UD QP */
	uint32_t qkey;
	uint32_t private_len;
	struct sr_sockaddr src, dst;
	struct sr_cm_param param;
	uint8_t private_data[SR_CM_PRIVATE];
};

#endif
