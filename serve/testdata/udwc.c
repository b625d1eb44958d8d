/* Every field of a UD receive completion through softroce's library, and
 * the 40 bytes the receive buffer starts with, for a SEND and a SEND with
 * immediate between two UD QPs of one device.
 *
 * What rxe hands a program (drivers/infiniband/sw/rxe/rxe_resp.c,
 * do_complete for a user CQ: the CQE is zeroed, then status, qp_num, wr_id,
 * opcode IBV_WC_RECV, byte_len, wc_flags IBV_WC_GRH (| IBV_WC_WITH_IMM with
 * imm_data), src_qp from the DETH; pkey_index, slid and dlid_path_bits stay
 * 0; execute() writes the IPv4 header into the last 20 bytes of the GRH
 * area after 20 zero bytes, or the whole IPv6 header) — except sl: rxe
 * leaves it 0, mlx5 reports the RoCE packet type there (bit 3: a UDP
 * header, RoCEv2; bits 2-0: 2 IPv4, 1 IPv6), which UCX's ud_verbs reads to
 * find the destination address in the GRH. softroce delivers mlx5's value;
 * argv[1] is the sl expected.
 *
 * Prints "ok" on success. */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define die(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static struct ibv_context *c;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

static struct ibv_qp *ud_qp(void)
{
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *q = ibv_create_qp(pd, &ia);
	if (!q)
		die("create qp failed");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("modify to INIT failed");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE))
		die("modify to RTR failed");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 5;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify to RTS failed");
	return q;
}

static struct ibv_wc wait_wc(uint64_t id)
{
	struct ibv_wc wc;
	int n;
	memset(&wc, 0xa5, sizeof(wc)); /* every field must be written */
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
		die("completion %d: wr_id %llu (want %llu) status %s", n, (unsigned long long)wc.wr_id,
		    (unsigned long long)id, ibv_wc_status_str(wc.status));
	return wc;
}

static unsigned csum(const unsigned char *p, int n)
{
	unsigned s = 0;
	for (int i = 0; i < n; i += 2)
		s += p[i] << 8 | p[i + 1];
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return s;
}

/* check_grh checks the 40 bytes before a datagram of n payload bytes
 * (imm: 4 more on the wire) sent from and to the device's own address. */
static void check_grh(const unsigned char *g, unsigned n, int imm)
{
	unsigned udp = 8 + 12 + 8 + (imm ? 4 : 0) + ((n + 3) & ~3u) + 4; /* UDP, BTH, DETH, ImmDt, padded payload, ICRC */
	int v4 = IN6_IS_ADDR_V4MAPPED((struct in6_addr *)gid.raw);
	if (v4) {
		const unsigned char *ip = g + 20;
		for (int i = 0; i < 20; i++)
			if (g[i])
				die("GRH byte %d is %#x: rxe leaves the first 20 bytes 0 on IPv4", i, g[i]);
		if (ip[0] != 0x45 || ip[9] != 17 || (ip[2] << 8 | ip[3]) != 20 + udp)
			die("IPv4 header: version/IHL %#x protocol %u total length %u (want 0x45, 17, %u)", ip[0], ip[9],
			    ip[2] << 8 | ip[3], 20 + udp);
		if (csum(ip, 20) != 0xffff)
			die("IPv4 header checksum does not add up");
		if (memcmp(ip + 12, gid.raw + 12, 4) || memcmp(ip + 16, gid.raw + 12, 4))
			die("IPv4 source or destination is not the device's address");
	} else {
		if (g[0] >> 4 != 6 || g[6] != 17 || (g[4] << 8 | g[5]) != udp)
			die("IPv6 header: version %u next header %u payload length %u (want 6, 17, %u)", g[0] >> 4, g[6],
			    g[4] << 8 | g[5], udp);
		if (memcmp(g + 8, gid.raw, 16) || memcmp(g + 24, gid.raw, 16))
			die("IPv6 source or destination is not the device's address");
	}
}

static void check_wc(const struct ibv_wc *wc, struct ibv_qp *to, struct ibv_qp *from, unsigned n, int imm,
		     unsigned sl)
{
	unsigned flags = IBV_WC_GRH | (imm ? IBV_WC_WITH_IMM : 0);
	if (wc->opcode != IBV_WC_RECV || wc->vendor_err != 0 || wc->byte_len != 40 + n)
		die("opcode %d vendor_err %u byte_len %u (want IBV_WC_RECV, 0, %u)", wc->opcode, wc->vendor_err,
		    wc->byte_len, 40 + n);
	if (wc->qp_num != to->qp_num || wc->src_qp != from->qp_num)
		die("qp_num %u src_qp %u (want %u, %u)", wc->qp_num, wc->src_qp, to->qp_num, from->qp_num);
	if (wc->wc_flags != flags)
		die("wc_flags %#x (want %#x)", wc->wc_flags, flags);
	if (imm && wc->imm_data != htonl(0x12345678))
		die("imm_data %#x (want htonl(0x12345678))", wc->imm_data);
	if (wc->pkey_index != 0 || wc->slid != 0 || wc->dlid_path_bits != 0)
		die("pkey_index %u slid %u dlid_path_bits %u (want 0: rxe's)", wc->pkey_index, wc->slid,
		    wc->dlid_path_bits);
	if (wc->sl != sl)
		die("sl %u (want %u, the RoCE packet type mlx5 reports)", wc->sl, sl);
}

int main(int argc, char **argv)
{
	if (argc != 2)
		die("usage: udwc SL");
	unsigned sl = atoi(argv[1]);
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		die("no device");
	c = ibv_open_device(l[0]);
	pd = c ? ibv_alloc_pd(c) : NULL;
	cq = c ? ibv_create_cq(c, 64, NULL, NULL, 0) : NULL;
	unsigned char *buf = calloc(1, 1 << 16);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr || !cq || ibv_query_gid(c, 1, 0, &gid))
		die("setup failed");
	struct ibv_qp *u1 = ud_qp(), *u2 = ud_qp();
	/* UCX's address handle: flow label ~0, its SL and traffic class. */
	struct ibv_ah_attr aa = { .is_global = 1, .grh = { .dgid = gid, .hop_limit = 255, .flow_label = ~0u,
							    .traffic_class = 106 },
				  .dlid = 0xc000, .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		die("create ah with UCX's attributes failed");
	for (int imm = 0; imm < 2; imm++) {
		unsigned char *r = buf + 20000;
		memset(r, 0xa5, 40 + 100);
		struct ibv_sge g = { (uintptr_t)r, 40 + 100, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 200 + imm, .sg_list = &g, .num_sge = 1 }, *badr;
		if (ibv_post_recv(u2, &w, &badr))
			die("post recv failed");
		unsigned n = imm ? 5 : 9;
		strcpy((char *)buf + 40000, imm ? "with" : "datagram");
		struct ibv_sge s = { (uintptr_t)buf + 40000, n, mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 1 + imm, .sg_list = &s, .num_sge = 1,
					  .opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x12345678) }, *bad;
		sw.wr.ud.ah = ah;
		sw.wr.ud.remote_qpn = u2->qp_num;
		sw.wr.ud.remote_qkey = 0x11111111;
		if (ibv_post_send(u1, &sw, &bad))
			die("post send failed");
		wait_wc(1 + imm);
		struct ibv_wc wc = wait_wc(200 + imm);
		check_wc(&wc, u2, u1, n, imm, sl);
		check_grh(r, n, imm);
		if (memcmp(r + 40, buf + 40000, n))
			die("payload differs");
	}
	puts("ok");
	return 0;
}
