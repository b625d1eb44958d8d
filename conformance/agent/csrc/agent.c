/*
 * softroce-agent: a small verbs agent for the softroce conformance harness.
 * It runs beside an RDMA device (kernel rdma_rxe in the harness's VM, or a
 * real RNIC on a lab host), listens on a TCP port and executes one verbs
 * operation per request line, so the harness can script the device's
 * endpoint step by step: open the device, allocate a PD, register memory,
 * create CQs, SRQs, RC, UC and UD QPs and address handles, walk a QP
 * through INIT/RTR/RTS, post work requests, poll completions and async
 * events, and read or write registered memory.
 *
 * Protocol (one client at a time; everything a client created is freed
 * when it disconnects). The first line a client sends must be
 * "auth TOKEN" with the agent's shared secret; anything else, or a wrong
 * token, is refused and the connection closed. Then a request is a
 * command word followed by key=value arguments; numbers are decimal or
 * 0x-prefixed hex. Every request gets exactly one reply line: "ok" plus
 * key=value results, or "err " plus a message. Unknown commands are
 * refused. The package documentation of conformance/agent lists the
 * commands; docs/remote.md says how to run it on a host with an RNIC.
 *
 * The channel is not encrypted: it is meant for a lab network.
 *
 * Build: gcc -O2 -Wall -o softroce-agent agent.c -libverbs
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <inttypes.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <endian.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define MAXOBJ 64
#define MAXARGS 32
/* Longest request line: memw of a 256 KiB region in hex, with room. */
#define MAXLINE (1 << 20)
/* Longest first (auth) line, and how long a client may take to send it. */
#define MAXAUTH 512
#define AUTH_TIMEOUT_S 10

/* Configuration from the command line. */
static const char *cfg_device; /* NULL: the first device, or open dev= */
static int cfg_gid = 1;        /* default source GID index (rxe: 1, IPv4) */
static char token[257];
static size_t token_len;

struct mr {
	struct ibv_mr *mr;
	char *buf;
	size_t len;
};

struct cq {
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;
	int armed;
};

static struct ibv_context *ctx;
static struct ibv_pd *pds[MAXOBJ];
static struct mr mrs[MAXOBJ];
static struct cq cqs[MAXOBJ];
static struct ibv_qp *qps[MAXOBJ];
static struct ibv_srq *srqs[MAXOBJ];
static struct ibv_mw *mws[MAXOBJ];
static struct ibv_ah *ahs[MAXOBJ];

static FILE *out;

static void reply(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfprintf(out, fmt, ap);
	va_end(ap);
	fputc('\n', out);
	fflush(out);
}

/* Arguments of the current request. */
static char *keys[MAXARGS], *vals[MAXARGS];
static int nargs;

static const char *arg(const char *k)
{
	for (int i = 0; i < nargs; i++)
		if (strcmp(keys[i], k) == 0)
			return vals[i];
	return NULL;
}

/* num reads a numeric argument; a missing one takes def, or fails when
 * required. */
static int num(const char *k, uint64_t *v, int required, uint64_t def)
{
	const char *s = arg(k);
	char *end;
	if (!s) {
		if (required) {
			reply("err missing argument %s", k);
			return -1;
		}
		*v = def;
		return 0;
	}
	errno = 0;
	*v = strtoull(s, &end, 0);
	if (errno || *end || end == s) {
		reply("err bad number %s=%s", k, s);
		return -1;
	}
	return 0;
}

#define NUM(k, var) \
	uint64_t var; \
	if (num(k, &var, 1, 0)) \
		return
#define OPT(k, var, def) \
	uint64_t var; \
	if (num(k, &var, 0, def)) \
		return

/* obj checks an object id argument against a table. */
#define OBJ(k, table, field, var) \
	NUM(k, var##_id); \
	if (var##_id < 1 || var##_id >= MAXOBJ || !table[var##_id] field) { \
		reply("err no such %s %" PRIu64, k, var##_id); \
		return; \
	}

static int slot_pd(void) { for (int i = 1; i < MAXOBJ; i++) if (!pds[i]) return i; return -1; }
static int slot_mr(void) { for (int i = 1; i < MAXOBJ; i++) if (!mrs[i].mr) return i; return -1; }
static int slot_cq(void) { for (int i = 1; i < MAXOBJ; i++) if (!cqs[i].cq) return i; return -1; }
static int slot_qp(void) { for (int i = 1; i < MAXOBJ; i++) if (!qps[i]) return i; return -1; }
static int slot_srq(void) { for (int i = 1; i < MAXOBJ; i++) if (!srqs[i]) return i; return -1; }
static int slot_mw(void) { for (int i = 1; i < MAXOBJ; i++) if (!mws[i]) return i; return -1; }
static int slot_ah(void) { for (int i = 1; i < MAXOBJ; i++) if (!ahs[i]) return i; return -1; }

static int hexval(int c)
{
	if (c >= '0' && c <= '9') return c - '0';
	if (c >= 'a' && c <= 'f') return c - 'a' + 10;
	if (c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

static int unhex(const char *s, uint8_t *b, size_t n)
{
	if (strlen(s) != 2 * n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		int h = hexval(s[2 * i]), l = hexval(s[2 * i + 1]);
		if (h < 0 || l < 0)
			return -1;
		b[i] = (uint8_t)(h << 4 | l);
	}
	return 0;
}

/* rdma_cm endpoints (cmlisten, cmconnect): rping processes the agent
 * started, killed with the session. */
#define MAXCM 8
static pid_t cmprocs[MAXCM];

static void cm_kill_all(void)
{
	for (int i = 0; i < MAXCM; i++) {
		if (cmprocs[i] > 0) {
			kill(-cmprocs[i], SIGKILL);
			kill(cmprocs[i], SIGKILL);
			waitpid(cmprocs[i], NULL, 0);
		}
		cmprocs[i] = 0;
	}
}

static void destroy_all(void)
{
	cm_kill_all();
	/* Windows first: a region with windows bound cannot be deregistered. */
	for (int i = 0; i < MAXOBJ; i++) {
		if (mws[i]) ibv_dealloc_mw(mws[i]);
		mws[i] = NULL;
	}
	for (int i = 0; i < MAXOBJ; i++) {
		if (qps[i]) ibv_destroy_qp(qps[i]);
		qps[i] = NULL;
	}
	for (int i = 0; i < MAXOBJ; i++) {
		if (ahs[i]) ibv_destroy_ah(ahs[i]);
		ahs[i] = NULL;
	}
	for (int i = 0; i < MAXOBJ; i++) {
		if (srqs[i]) ibv_destroy_srq(srqs[i]);
		srqs[i] = NULL;
	}
	for (int i = 0; i < MAXOBJ; i++) {
		if (mrs[i].mr) { ibv_dereg_mr(mrs[i].mr); free(mrs[i].buf); }
		memset(&mrs[i], 0, sizeof mrs[i]);
	}
	for (int i = 0; i < MAXOBJ; i++) {
		if (cqs[i].cq) { ibv_destroy_cq(cqs[i].cq); ibv_destroy_comp_channel(cqs[i].ch); }
		memset(&cqs[i], 0, sizeof cqs[i]);
	}
	for (int i = 0; i < MAXOBJ; i++) {
		if (pds[i]) ibv_dealloc_pd(pds[i]);
		pds[i] = NULL;
	}
	if (ctx) ibv_close_device(ctx);
	ctx = NULL;
}

static void cmd_open(void)
{
	const char *name = arg("dev");
	struct ibv_device **list;
	int n;
	if (ctx) { reply("err device already open"); return; }
	/* An agent started for one device serves that device only. */
	if (name && *name == 0)
		name = NULL;
	if (cfg_device && name && strcmp(name, cfg_device) != 0) {
		reply("err this agent serves device %s only", cfg_device);
		return;
	}
	if (!name)
		name = cfg_device;
	list = ibv_get_device_list(&n);
	if (!list) { reply("err no RDMA device (ibv_get_device_list: %s)", strerror(errno)); return; }
	for (int i = 0; i < n; i++) {
		if (!name || strcmp(ibv_get_device_name(list[i]), name) == 0) {
			ctx = ibv_open_device(list[i]);
			if (!ctx) {
				reply("err ibv_open_device: %s", strerror(errno));
				ibv_free_device_list(list);
				return;
			}
			reply("ok dev=%s", ibv_get_device_name(list[i]));
			ibv_free_device_list(list);
			return;
		}
	}
	ibv_free_device_list(list);
	reply("err no device %s", name ? name : "(any)");
}

#define NEEDCTX() if (!ctx) { reply("err device not open"); return; }

static void cmd_pd(void)
{
	NEEDCTX();
	int i = slot_pd();
	if (i < 0) { reply("err too many PDs"); return; }
	pds[i] = ibv_alloc_pd(ctx);
	if (!pds[i]) { reply("err ibv_alloc_pd: %s", strerror(errno)); return; }
	reply("ok pd=%d", i);
}

static void cmd_mr(void)
{
	NEEDCTX();
	OBJ("pd", pds, , pd);
	NUM("len", len);
	OPT("access", access, IBV_ACCESS_LOCAL_WRITE);
	int i = slot_mr();
	if (i < 0) { reply("err too many MRs"); return; }
	if (len == 0 || len > (1ull << 30)) { reply("err bad len"); return; }
	if (posix_memalign((void **)&mrs[i].buf, 4096, len)) { reply("err out of memory"); return; }
	memset(mrs[i].buf, 0, len);
	mrs[i].len = len;
	mrs[i].mr = ibv_reg_mr(pds[pd_id], mrs[i].buf, len, (int)access);
	if (!mrs[i].mr) {
		reply("err ibv_reg_mr: %s", strerror(errno));
		free(mrs[i].buf);
		memset(&mrs[i], 0, sizeof mrs[i]);
		return;
	}
	reply("ok mr=%d addr=0x%" PRIx64 " lkey=0x%x rkey=0x%x", i, (uint64_t)(uintptr_t)mrs[i].buf,
	      mrs[i].mr->lkey, mrs[i].mr->rkey);
}

static void cmd_cq(void)
{
	NEEDCTX();
	OPT("cqe", cqe, 256);
	int i = slot_cq();
	if (i < 0) { reply("err too many CQs"); return; }
	cqs[i].ch = ibv_create_comp_channel(ctx);
	if (!cqs[i].ch) { reply("err ibv_create_comp_channel: %s", strerror(errno)); return; }
	cqs[i].cq = ibv_create_cq(ctx, (int)cqe, NULL, cqs[i].ch, 0);
	if (!cqs[i].cq) {
		reply("err ibv_create_cq: %s", strerror(errno));
		ibv_destroy_comp_channel(cqs[i].ch);
		memset(&cqs[i], 0, sizeof cqs[i]);
		return;
	}
	reply("ok cq=%d", i);
}

static void cmd_qp(void)
{
	NEEDCTX();
	OBJ("pd", pds, , pd);
	OBJ("scq", cqs, .cq, scq);
	OBJ("rcq", cqs, .cq, rcq);
	OPT("sq", sq, 64);
	OPT("rq", rq, 64);
	OPT("inline", inl, 0);
	OPT("srq", srq_id, 0);
	if (srq_id && (srq_id >= MAXOBJ || !srqs[srq_id])) { reply("err no such srq %" PRIu64, srq_id); return; }
	const char *type = arg("type");
	enum ibv_qp_type qpt = IBV_QPT_RC;
	if (type && strcmp(type, "uc") == 0) qpt = IBV_QPT_UC;
	else if (type && strcmp(type, "ud") == 0) qpt = IBV_QPT_UD;
	else if (type && strcmp(type, "rc") != 0) { reply("err type must be rc, uc or ud"); return; }
	int i = slot_qp();
	if (i < 0) { reply("err too many QPs"); return; }
	struct ibv_qp_init_attr a = {
		.send_cq = cqs[scq_id].cq,
		.recv_cq = cqs[rcq_id].cq,
		.cap = { .max_send_wr = (uint32_t)sq, .max_recv_wr = (uint32_t)rq,
			 .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = (uint32_t)inl },
		.qp_type = qpt,
		.srq = srq_id ? srqs[srq_id] : NULL,
	};
	qps[i] = ibv_create_qp(pds[pd_id], &a);
	if (!qps[i]) { reply("err ibv_create_qp: %s", strerror(errno)); return; }
	reply("ok qp=%d qpn=0x%x", i, qps[i]->qp_num);
}

static void cmd_gid(void)
{
	NEEDCTX();
	OPT("idx", idx, (uint64_t)cfg_gid);
	OPT("port", port, 1);
	union ibv_gid g;
	if (ibv_query_gid(ctx, (uint8_t)port, (int)idx, &g)) { reply("err ibv_query_gid: %s", strerror(errno)); return; }
	char s[33];
	for (int i = 0; i < 16; i++)
		sprintf(s + 2 * i, "%02x", g.raw[i]);
	reply("ok gid=%s", s);
}

static int mtu_enum(uint64_t b)
{
	switch (b) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	}
	return -1;
}

static const char *state_name(enum ibv_qp_state s)
{
	static const char *n[] = { "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR" };
	return (unsigned)s < sizeof n / sizeof n[0] ? n[s] : "UNKNOWN";
}

static void cmd_init(void)
{
	OBJ("qp", qps, , qp);
	OPT("access", access, 0);
	OPT("port", port, 1);
	OPT("pkey", pkey, 0);
	OPT("qkey", qkey, 0);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = (uint16_t)pkey,
				 .port_num = (uint8_t)port, .qp_access_flags = (unsigned)access, .qkey = (uint32_t)qkey };
	/* A UD QP takes a Q_Key at INIT instead of access flags. */
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
		   (qps[qp_id]->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
	int rc = ibv_modify_qp(qps[qp_id], &a, mask);
	if (rc) { reply("err modify to INIT: %s", strerror(rc)); return; }
	reply("ok");
}

static void cmd_rtr(void)
{
	OBJ("qp", qps, , qp);
	NUM("dqpn", dqpn);
	NUM("rpsn", rpsn);
	OPT("mtu", mtu, 1024);
	OPT("rd_atomic", rd, 1);
	OPT("min_rnr", min_rnr, 12);
	OPT("sgid", sgid, (uint64_t)cfg_gid);
	OPT("hop", hop, 64);
	OPT("tc", tc, 0);
	OPT("sl", sl, 0);
	OPT("port", port, 1);
	const char *dgid = arg("dgid");
	int m = mtu_enum(mtu);
	if (m < 0) { reply("err bad mtu %" PRIu64, mtu); return; }
	if (!dgid) { reply("err missing argument dgid"); return; }
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = (enum ibv_mtu)m,
		.dest_qp_num = (uint32_t)dqpn, .rq_psn = (uint32_t)rpsn,
		.max_dest_rd_atomic = (uint8_t)rd, .min_rnr_timer = (uint8_t)min_rnr,
		.ah_attr = { .is_global = 1, .port_num = (uint8_t)port, .sl = (uint8_t)sl,
			     .grh = { .sgid_index = (uint8_t)sgid, .hop_limit = (uint8_t)hop,
				      .traffic_class = (uint8_t)tc } },
	};
	if (unhex(dgid, a.ah_attr.grh.dgid.raw, 16)) { reply("err bad dgid %s", dgid); return; }
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (qps[qp_id]->qp_type == IBV_QPT_RC)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	int rc = ibv_modify_qp(qps[qp_id], &a, mask);
	if (rc) { reply("err modify to RTR: %s", strerror(rc)); return; }
	reply("ok");
}

static void cmd_rts(void)
{
	OBJ("qp", qps, , qp);
	NUM("spsn", spsn);
	OPT("timeout", timeout, 14);
	OPT("retry", retry, 7);
	OPT("rnr_retry", rnr_retry, 7);
	OPT("rd_atomic", rd, 1);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = (uint32_t)spsn, .timeout = (uint8_t)timeout,
				 .retry_cnt = (uint8_t)retry, .rnr_retry = (uint8_t)rnr_retry,
				 .max_rd_atomic = (uint8_t)rd };
	int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (qps[qp_id]->qp_type == IBV_QPT_RC)
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	int rc = ibv_modify_qp(qps[qp_id], &a, mask);
	if (rc) { reply("err modify to RTS: %s", strerror(rc)); return; }
	reply("ok");
}

/* udrtr qp= and udrts qp= spsn=: the RTR and RTS steps of a UD QP, which
 * take no path attributes. */
static void cmd_udrtr(void)
{
	OBJ("qp", qps, , qp);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	int rc = ibv_modify_qp(qps[qp_id], &a, IBV_QP_STATE);
	if (rc) { reply("err modify to RTR: %s", strerror(rc)); return; }
	reply("ok");
}

static void cmd_udrts(void)
{
	OBJ("qp", qps, , qp);
	NUM("spsn", spsn);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = (uint32_t)spsn };
	int rc = ibv_modify_qp(qps[qp_id], &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	if (rc) { reply("err modify to RTS: %s", strerror(rc)); return; }
	reply("ok");
}

/* ah pd= dgid= sgid= hop= tc= sl= fl=: an address handle for UD sends. */
static void cmd_ah(void)
{
	NEEDCTX();
	OBJ("pd", pds, , pd);
	OPT("sgid", sgid, (uint64_t)cfg_gid);
	OPT("hop", hop, 64);
	OPT("tc", tc, 0);
	OPT("sl", sl, 0);
	OPT("fl", fl, 0);
	OPT("port", port, 1);
	const char *dgid = arg("dgid");
	if (!dgid) { reply("err missing argument dgid"); return; }
	int i = slot_ah();
	if (i < 0) { reply("err too many AHs"); return; }
	struct ibv_ah_attr a = { .is_global = 1, .port_num = (uint8_t)port, .sl = (uint8_t)sl,
				 .grh = { .sgid_index = (uint8_t)sgid, .hop_limit = (uint8_t)hop,
					  .traffic_class = (uint8_t)tc, .flow_label = (uint32_t)fl } };
	if (unhex(dgid, a.grh.dgid.raw, 16)) { reply("err bad dgid %s", dgid); return; }
	ahs[i] = ibv_create_ah(pds[pd_id], &a);
	if (!ahs[i]) { reply("err ibv_create_ah: %s", strerror(errno)); return; }
	reply("ok ah=%d", i);
}

static void cmd_state(void)
{
	OBJ("qp", qps, , qp);
	const char *to = arg("to");
	struct ibv_qp_attr a = { 0 };
	if (!to) { reply("err missing argument to"); return; }
	if (strcmp(to, "ERR") == 0) a.qp_state = IBV_QPS_ERR;
	else if (strcmp(to, "RESET") == 0) a.qp_state = IBV_QPS_RESET;
	else if (strcmp(to, "SQD") == 0) a.qp_state = IBV_QPS_SQD;
	else { reply("err state must be ERR, RESET or SQD"); return; }
	int rc = ibv_modify_qp(qps[qp_id], &a, IBV_QP_STATE);
	if (rc) { reply("err modify to %s: %s", to, strerror(rc)); return; }
	reply("ok");
}

static void cmd_query(void)
{
	OBJ("qp", qps, , qp);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc = ibv_query_qp(qps[qp_id], &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_RQ_PSN | IBV_QP_PATH_MTU | IBV_QP_QKEY |
				      IBV_QP_DEST_QPN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_MIN_RNR_TIMER | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC, &ia);
	if (rc) { reply("err ibv_query_qp: %s", strerror(rc)); return; }
	reply("ok state=%s sq_psn=0x%x rq_psn=0x%x mtu=%d dqpn=0x%x timeout=%u retry=%u rnr_retry=%u min_rnr=%u "
	      "rd_atomic=%u dest_rd_atomic=%u qkey=0x%x",
	      state_name(a.qp_state), a.sq_psn, a.rq_psn, 128 << a.path_mtu, a.dest_qp_num, a.timeout,
	      a.retry_cnt, a.rnr_retry, a.min_rnr_timer, a.max_rd_atomic, a.max_dest_rd_atomic, a.qkey);
}

/* local resolves mr/off/len into a scatter/gather element. */
static int local(struct ibv_sge *sge, int *nsge)
{
	uint64_t id, off, len;
	if (num("len", &len, 0, 0) || num("mr", &id, len > 0, 0) || num("off", &off, 0, 0))
		return -1;
	if (len == 0 && id == 0) { /* zero-length operation: no SGE at all */
		memset(sge, 0, sizeof *sge);
		*nsge = 0;
		return 0;
	}
	if (id < 1 || id >= MAXOBJ || !mrs[id].mr) { reply("err no such mr %" PRIu64, id); return -1; }
	if (off > mrs[id].len || len > mrs[id].len - off) { reply("err off/len outside mr %" PRIu64, id); return -1; }
	sge->addr = (uint64_t)(uintptr_t)mrs[id].buf + off;
	sge->length = (uint32_t)len;
	sge->lkey = mrs[id].mr->lkey;
	*nsge = len > 0;
	return 0;
}

static void cmd_send(void)
{
	OBJ("qp", qps, , qp);
	NUM("wr", wr_id);
	const char *op = arg("op");
	OPT("raddr", raddr, 0);
	OPT("rkey", rkey, 0);
	OPT("imm", imm, 0);
	OPT("compare", compare, 0);
	OPT("swap", swap, 0);
	OPT("add", add, 0);
	OPT("signaled", signaled, 1);
	OPT("fence", fence, 0);
	OPT("solicited", solicited, 0);
	OPT("inline", inl, 0);
	OPT("ah", ah_id, 0);
	OPT("dqpn", dqpn, 0);
	OPT("qkey", qkey, 0);
	struct ibv_sge sge;
	struct ibv_send_wr w = { .wr_id = wr_id, .sg_list = &sge }, *bad;
	if (!op) { reply("err missing argument op"); return; }
	if (ah_id && (ah_id >= MAXOBJ || !ahs[ah_id])) { reply("err no such ah %" PRIu64, ah_id); return; }
	if (local(&sge, &w.num_sge))
		return;
	if (strcmp(op, "send") == 0) w.opcode = IBV_WR_SEND;
	else if (strcmp(op, "send_imm") == 0) w.opcode = IBV_WR_SEND_WITH_IMM;
	else if (strcmp(op, "write") == 0) w.opcode = IBV_WR_RDMA_WRITE;
	else if (strcmp(op, "write_imm") == 0) w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	else if (strcmp(op, "read") == 0) w.opcode = IBV_WR_RDMA_READ;
	else if (strcmp(op, "cas") == 0) w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	else if (strcmp(op, "faa") == 0) w.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	else if (strcmp(op, "send_inv") == 0) w.opcode = IBV_WR_SEND_WITH_INV;
	else { reply("err unknown op %s", op); return; }
	/* imm_data is carried in network byte order: the protocol's imm is
	 * the value of the ImmDt field read big-endian off the wire, both
	 * here and in poll replies. */
	w.imm_data = htonl((uint32_t)imm);
	/* SEND_WITH_INV: rkey is the key the peer is to invalidate (the
	 * invalidate_rkey union member shares imm_data's place). */
	if (w.opcode == IBV_WR_SEND_WITH_INV)
		w.invalidate_rkey = (uint32_t)rkey;
	if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		w.wr.atomic.remote_addr = raddr;
		w.wr.atomic.rkey = (uint32_t)rkey;
		w.wr.atomic.compare_add = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? compare : add;
		w.wr.atomic.swap = swap;
	} else if (ah_id) {
		/* UD: the address handle, remote QPN and Q_Key. */
		w.wr.ud.ah = ahs[ah_id];
		w.wr.ud.remote_qpn = (uint32_t)dqpn;
		w.wr.ud.remote_qkey = (uint32_t)qkey;
	} else {
		w.wr.rdma.remote_addr = raddr;
		w.wr.rdma.rkey = (uint32_t)rkey;
	}
	w.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (fence ? IBV_SEND_FENCE : 0) |
		       (solicited ? IBV_SEND_SOLICITED : 0) | (inl ? IBV_SEND_INLINE : 0);
	int rc = ibv_post_send(qps[qp_id], &w, &bad);
	if (rc) { reply("err ibv_post_send: %s", strerror(rc)); return; }
	reply("ok");
}

/* mw pd= type=1|2: allocate a memory window. */
static void cmd_mw(void)
{
	NEEDCTX();
	OBJ("pd", pds, , pd);
	NUM("type", type);
	int i = slot_mw();
	if (i < 0) { reply("err too many MWs"); return; }
	if (type != 1 && type != 2) { reply("err bad type"); return; }
	mws[i] = ibv_alloc_mw(pds[pd_id], type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
	if (!mws[i]) { reply("err ibv_alloc_mw: %s", strerror(errno)); return; }
	reply("ok mw=%d rkey=0x%x", i, mws[i]->rkey);
}

/* bindmw qp= wr= mw= mr= off= len= access= signaled=: bind a window over
 * [off, off+len) of mr, with ibv_bind_mw for a type 1 window and a
 * BIND_MW work request (new rkey: ibv_inc_rkey of the current one) for a
 * type 2 window. Replies with the window's new rkey. */
static void cmd_bindmw(void)
{
	OBJ("qp", qps, , qp);
	NUM("wr", wr_id);
	OBJ("mw", mws, , mw);
	OBJ("mr", mrs, .mr, mr);
	NUM("off", off);
	NUM("len", len);
	NUM("access", access);
	OPT("signaled", signaled, 1);
	struct ibv_mw *m = mws[mw_id];
	struct ibv_mw_bind_info bi = { .mr = mrs[mr_id].mr, .addr = (uint64_t)(uintptr_t)mrs[mr_id].buf + off,
				       .length = len, .mw_access_flags = (unsigned int)access };
	int rc;
	if (m->type == IBV_MW_TYPE_1) {
		struct ibv_mw_bind b = { .wr_id = wr_id, .send_flags = signaled ? IBV_SEND_SIGNALED : 0, .bind_info = bi };
		rc = ibv_bind_mw(qps[qp_id], m, &b);
		if (rc) { reply("err ibv_bind_mw: %s", strerror(rc)); return; }
		reply("ok rkey=0x%x", m->rkey);
		return;
	}
	struct ibv_send_wr w = { .wr_id = wr_id, .opcode = IBV_WR_BIND_MW,
				 .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;
	w.bind_mw.mw = m;
	w.bind_mw.rkey = ibv_inc_rkey(m->rkey);
	w.bind_mw.bind_info = bi;
	rc = ibv_post_send(qps[qp_id], &w, &bad);
	if (rc) { reply("err ibv_post_send: %s", strerror(rc)); return; }
	m->rkey = w.bind_mw.rkey;
	reply("ok rkey=0x%x", m->rkey);
}

/* localinv qp= wr= rkey= signaled=: post a LOCAL_INV work request. */
static void cmd_localinv(void)
{
	OBJ("qp", qps, , qp);
	NUM("wr", wr_id);
	NUM("rkey", rkey);
	OPT("signaled", signaled, 1);
	struct ibv_send_wr w = { .wr_id = wr_id, .opcode = IBV_WR_LOCAL_INV,
				 .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;
	w.invalidate_rkey = (uint32_t)rkey;
	int rc = ibv_post_send(qps[qp_id], &w, &bad);
	if (rc) { reply("err ibv_post_send: %s", strerror(rc)); return; }
	reply("ok");
}

static void cmd_recv(void)
{
	OBJ("qp", qps, , qp);
	NUM("wr", wr_id);
	struct ibv_sge sge;
	struct ibv_recv_wr w = { .wr_id = wr_id, .sg_list = &sge }, *bad;
	if (local(&sge, &w.num_sge))
		return;
	int rc = ibv_post_recv(qps[qp_id], &w, &bad);
	if (rc) { reply("err ibv_post_recv: %s", strerror(rc)); return; }
	reply("ok");
}

static void cmd_srq(void)
{
	NEEDCTX();
	OBJ("pd", pds, , pd);
	OPT("wr", max_wr, 64);
	OPT("limit", limit, 0);
	int i = slot_srq();
	if (i < 0) { reply("err too many SRQs"); return; }
	struct ibv_srq_init_attr a = { .attr = { .max_wr = (uint32_t)max_wr, .max_sge = 1, .srq_limit = (uint32_t)limit } };
	srqs[i] = ibv_create_srq(pds[pd_id], &a);
	if (!srqs[i]) { reply("err ibv_create_srq: %s", strerror(errno)); return; }
	uint32_t num = 0;
	ibv_get_srq_num(srqs[i], &num);
	reply("ok srq=%d srqn=0x%x max_wr=%u", i, num, a.attr.max_wr);
}

static void cmd_srecv(void)
{
	OBJ("srq", srqs, , srq);
	NUM("wr", wr_id);
	struct ibv_sge sge;
	struct ibv_recv_wr w = { .wr_id = wr_id, .sg_list = &sge }, *bad;
	if (local(&sge, &w.num_sge))
		return;
	int rc = ibv_post_srq_recv(srqs[srq_id], &w, &bad);
	if (rc) { reply("err ibv_post_srq_recv: %s", strerror(rc)); return; }
	reply("ok");
}

static void cmd_srqlimit(void)
{
	OBJ("srq", srqs, , srq);
	NUM("limit", limit);
	struct ibv_srq_attr a = { .srq_limit = (uint32_t)limit };
	int rc = ibv_modify_srq(srqs[srq_id], &a, IBV_SRQ_LIMIT);
	if (rc) { reply("err ibv_modify_srq: %s", strerror(rc)); return; }
	reply("ok");
}

/* cmd_srqmod is ibv_modify_srq with IBV_SRQ_MAX_WR (a resize); it
 * replies the max_wr the device chose. */
static void cmd_srqmod(void)
{
	OBJ("srq", srqs, , srq);
	NUM("wr", wr);
	struct ibv_srq_attr a = { .max_wr = (uint32_t)wr };
	int rc = ibv_modify_srq(srqs[srq_id], &a, IBV_SRQ_MAX_WR);
	if (rc) { reply("err ibv_modify_srq: %s", strerror(rc)); return; }
	rc = ibv_query_srq(srqs[srq_id], &a);
	if (rc) { reply("err ibv_query_srq: %s", strerror(rc)); return; }
	reply("ok max_wr=%u", a.max_wr);
}

static void cmd_srqquery(void)
{
	OBJ("srq", srqs, , srq);
	struct ibv_srq_attr a;
	int rc = ibv_query_srq(srqs[srq_id], &a);
	if (rc) { reply("err ibv_query_srq: %s", strerror(rc)); return; }
	reply("ok max_wr=%u max_sge=%u limit=%u", a.max_wr, a.max_sge, a.srq_limit);
}

static int64_t now_ms(void);

/* cmd_event waits up to timeout ms for one async event. The element it
 * names is given as the agent's QP or SRQ id and the QP number. */
static void cmd_event(void)
{
	NEEDCTX();
	OPT("timeout", timeout, 1000);
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	int rc = poll(&p, 1, (int)timeout);
	if (rc < 0) { reply("err poll: %s", strerror(errno)); return; }
	if (rc == 0) { reply("ok none"); return; }
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev)) { reply("err ibv_get_async_event: %s", strerror(errno)); return; }
	int qp = 0, srq = 0;
	uint32_t qpn = 0;
	switch (ev.event_type) {
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		for (int i = 1; i < MAXOBJ; i++)
			if (srqs[i] == ev.element.srq) srq = i;
		break;
	case IBV_EVENT_CQ_ERR:
	case IBV_EVENT_DEVICE_FATAL:
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
	case IBV_EVENT_WQ_FATAL:
		break;
	default:
		qpn = ev.element.qp->qp_num;
		for (int i = 1; i < MAXOBJ; i++)
			if (qps[i] == ev.element.qp) qp = i;
	}
	int type = ev.event_type;
	ibv_ack_async_event(&ev);
	reply("ok type=%d qp=%d qpn=0x%x srq=%d str=%s", type, qp, qpn, srq, ibv_event_type_str(type));
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* cmd_poll waits on the CQ's completion channel instead of spinning: the
 * guest has one emulated CPU that rxe's own tasks need. */
static void cmd_poll(void)
{
	OBJ("cq", cqs, .cq, cq);
	OPT("timeout", timeout, 1000);
	struct cq *c = &cqs[cq_id];
	int64_t deadline = now_ms() + (int64_t)timeout;
	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0) { reply("err ibv_poll_cq failed"); return; }
		if (n == 1) {
			reply("ok wr=%" PRIu64 " status=%d opcode=%d len=%u imm=0x%x qpn=0x%x src_qp=0x%x "
			      "wc_flags=0x%x vendor_err=0x%x str=%s",
			      wc.wr_id, wc.status, wc.opcode, wc.byte_len, ntohl(wc.imm_data), wc.qp_num, wc.src_qp,
			      wc.wc_flags, wc.vendor_err, ibv_wc_status_str(wc.status));
			return;
		}
		if (!c->armed) {
			if (ibv_req_notify_cq(c->cq, 0)) { reply("err ibv_req_notify_cq failed"); return; }
			c->armed = 1;
			continue; /* poll once more: a completion may have raced the arming */
		}
		int64_t left = deadline - now_ms();
		if (left <= 0) { reply("ok none"); return; }
		struct pollfd p = { .fd = c->ch->fd, .events = POLLIN };
		int r = poll(&p, 1, (int)left);
		if (r < 0 && errno != EINTR) { reply("err poll: %s", strerror(errno)); return; }
		if (r > 0) {
			struct ibv_cq *ev;
			void *evctx;
			if (ibv_get_cq_event(c->ch, &ev, &evctx)) { reply("err ibv_get_cq_event failed"); return; }
			ibv_ack_cq_events(ev, 1);
			c->armed = 0;
		}
	}
}

static struct mr *mr_range(uint64_t *off, uint64_t *len, int need_len)
{
	uint64_t id;
	if (num("mr", &id, 1, 0) || num("off", off, 0, 0) || num("len", len, need_len, 0))
		return NULL;
	if (id < 1 || id >= MAXOBJ || !mrs[id].mr) { reply("err no such mr %" PRIu64, id); return NULL; }
	if (*off > mrs[id].len || *len > mrs[id].len - *off) { reply("err off/len outside mr %" PRIu64, id); return NULL; }
	return &mrs[id];
}

static void cmd_mem(void)
{
	uint64_t off, len;
	struct mr *m = mr_range(&off, &len, 1);
	if (!m)
		return;
	fputs("ok hex=", out);
	for (uint64_t i = 0; i < len; i++)
		fprintf(out, "%02x", (uint8_t)m->buf[off + i]);
	reply("");
}

static void cmd_memw(void)
{
	const char *hex = arg("hex");
	uint64_t off, len;
	if (!hex) { reply("err missing argument hex"); return; }
	len = 0;
	struct mr *m = mr_range(&off, &len, 0);
	if (!m)
		return;
	len = strlen(hex) / 2;
	if (strlen(hex) % 2 || off > m->len || len > m->len - off) { reply("err bad hex length"); return; }
	if (unhex(hex, (uint8_t *)m->buf + off, len)) { reply("err bad hex"); return; }
	reply("ok");
}

static void cmd_fill(void)
{
	uint64_t off, len;
	struct mr *m = mr_range(&off, &len, 1);
	if (!m)
		return;
	OPT("byte", b, 0);
	memset(m->buf + off, (int)(b & 0xff), len);
	reply("ok");
}

/* sanitize makes s a single reply token: blanks and '=' would split it. */
static void sanitize(char *s)
{
	for (; *s; s++)
		if (*s == ' ' || *s == '\t' || *s == '=' || *s == '\n' || *s == '\r')
			*s = '_';
}

/* sysfs_line reads the first line of a sysfs file into buf ("" if none). */
static void sysfs_line(const char *path, char *buf, size_t n)
{
	buf[0] = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(buf, (int)n, f))
		buf[strcspn(buf, "\n")] = 0;
	fclose(f);
}

/* cmd_devinfo reports what the device is: name, firmware (ibv_query_device
 * fw_ver), the kernel driver bound to its parent device (the name of the
 * sysfs device/driver link, absent for software devices), vendor and part
 * IDs, and the default GID with its type. */
static void cmd_devinfo(void)
{
	struct ibv_context *c = ctx;
	struct ibv_device **list = NULL;
	int n = 0;
	if (!c) {
		list = ibv_get_device_list(&n);
		if (!list) { reply("err no RDMA device (ibv_get_device_list: %s)", strerror(errno)); return; }
		for (int i = 0; i < n && !c; i++)
			if (!cfg_device || strcmp(ibv_get_device_name(list[i]), cfg_device) == 0)
				c = ibv_open_device(list[i]);
		ibv_free_device_list(list);
		if (!c) {
			reply("err no RDMA device %s", cfg_device ? cfg_device : "(none found)");
			return;
		}
	}
	struct ibv_device_attr a;
	memset(&a, 0, sizeof a);
	int rc = ibv_query_device(c, &a);
	char name[IBV_SYSFS_NAME_MAX + 1], path[PATH_MAX], link[PATH_MAX], drv[256] = "", gidtype[64], gs[33] = "";
	snprintf(name, sizeof name, "%s", ibv_get_device_name(c->device));
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/device/driver", name);
	ssize_t l = readlink(path, link, sizeof link - 1);
	if (l > 0) {
		link[l] = 0;
		const char *b = strrchr(link, '/');
		snprintf(drv, sizeof drv, "%.255s", b ? b + 1 : link);
	}
	char desc[128], parent[64];
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/node_desc", name);
	sysfs_line(path, desc, sizeof desc);
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/parent", name);
	sysfs_line(path, parent, sizeof parent);
	sanitize(desc);
	sanitize(parent);
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/gid_attrs/types/%d", name, cfg_gid);
	sysfs_line(path, gidtype, sizeof gidtype);
	union ibv_gid g;
	if (ibv_query_gid(c, 1, cfg_gid, &g) == 0)
		for (int i = 0; i < 16; i++)
			sprintf(gs + 2 * i, "%02x", g.raw[i]);
	char fw[sizeof a.fw_ver + 1];
	snprintf(fw, sizeof fw, "%s", a.fw_ver);
	sanitize(fw);
	sanitize(drv);
	sanitize(gidtype);
	sanitize(name);
	if (c != ctx)
		ibv_close_device(c);
	if (rc) { reply("err ibv_query_device: %s", strerror(rc)); return; }
	reply("ok dev=%s fw=%s driver=%s vendor=0x%x part=0x%x hw=0x%x node_guid=0x%016" PRIx64
	      " gid_index=%d gid=%s gid_type=%s node_desc=%s parent=%s",
	      name, fw, drv, a.vendor_id, a.vendor_part_id, a.hw_ver, (uint64_t)be64toh(a.node_guid), cfg_gid, gs, gidtype,
	      desc, parent);
}

/* device_ipv4 writes the IPv4 address of the default GID (IPv4-mapped),
 * opening the device for the query when no session has it open. */
static int device_ipv4(char *buf, size_t n)
{
	struct ibv_context *c = ctx;
	if (!c) {
		int k = 0;
		struct ibv_device **list = ibv_get_device_list(&k);
		if (!list)
			return -1;
		for (int i = 0; i < k && !c; i++)
			if (!cfg_device || strcmp(ibv_get_device_name(list[i]), cfg_device) == 0)
				c = ibv_open_device(list[i]);
		ibv_free_device_list(list);
		if (!c)
			return -1;
	}
	union ibv_gid g;
	int rc = ibv_query_gid(c, 1, cfg_gid, &g);
	if (c != ctx)
		ibv_close_device(c);
	static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	if (rc || memcmp(g.raw, mapped, sizeof mapped) != 0)
		return -1;
	return inet_ntop(AF_INET, g.raw + 12, buf, (socklen_t)n) ? 0 : -1;
}

/* cm_spawn starts rping (rdmacm-utils) with argv, fixed by the caller: the
 * agent runs no other program, and never through a shell. */
static void cm_spawn(char *const argv[])
{
	int i;
	for (i = 0; i < MAXCM; i++) {
		if (cmprocs[i] > 0 && waitpid(cmprocs[i], NULL, WNOHANG) == cmprocs[i])
			cmprocs[i] = 0;
	}
	for (i = 0; i < MAXCM && cmprocs[i]; i++)
		;
	if (i == MAXCM) { reply("err too many rdma_cm endpoints"); return; }
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC)) { reply("err pipe: %s", strerror(errno)); return; }
	pid_t p = fork();
	if (p < 0) { reply("err fork: %s", strerror(errno)); close(pfd[0]); close(pfd[1]); return; }
	if (p == 0) {
		int nul = open("/dev/null", O_RDWR);
		dup2(nul, 0);
		dup2(nul, 1);
		dup2(nul, 2);
		setsid();
		execvp(argv[0], argv);
		int e = errno;
		if (write(pfd[1], &e, sizeof e) < 0) { /* the parent sees EOF */ }
		_exit(127);
	}
	close(pfd[1]);
	int e = 0;
	ssize_t r = read(pfd[0], &e, sizeof e);
	close(pfd[0]);
	if (r == (ssize_t)sizeof e) {
		waitpid(p, NULL, 0);
		reply("err start %s (rdmacm-utils): %s", argv[0], strerror(e));
		return;
	}
	cmprocs[i] = p;
	reply("ok cm=%d", i + 1);
}

/* cmlisten port=: an rdma_cm server (rping -s) on the device's address
 * that accepts one connection. */
static void cmd_cmlisten(void)
{
	NUM("port", port);
	char a[INET_ADDRSTRLEN], ps[8];
	if (port < 1 || port > 65535) { reply("err bad port"); return; }
	if (device_ipv4(a, sizeof a)) { reply("err the device's GID %d is not an IPv4 RoCE address", cfg_gid); return; }
	snprintf(ps, sizeof ps, "%u", (unsigned)port);
	char *argv[] = { "rping", "-s", "-a", a, "-p", ps, "-C", "1", NULL };
	cm_spawn(argv);
}

/* cmconnect addr= port=: an rdma_cm client (rping -c) connecting to addr. */
static void cmd_cmconnect(void)
{
	NUM("port", port);
	const char *addr = arg("addr");
	struct in_addr in;
	char a[INET_ADDRSTRLEN], ps[8];
	if (port < 1 || port > 65535) { reply("err bad port"); return; }
	if (!addr || inet_pton(AF_INET, addr, &in) != 1) { reply("err addr must be an IPv4 address"); return; }
	inet_ntop(AF_INET, &in, a, sizeof a);
	snprintf(ps, sizeof ps, "%u", (unsigned)port);
	char *argv[] = { "rping", "-c", "-a", a, "-p", ps, "-C", "1", NULL };
	cm_spawn(argv);
}

/* cmstop cm=: end an rdma_cm endpoint. */
static void cmd_cmstop(void)
{
	NUM("cm", id);
	if (id < 1 || id > MAXCM || cmprocs[id - 1] <= 0) { reply("err no such cm %" PRIu64, id); return; }
	pid_t p = cmprocs[id - 1];
	kill(-p, SIGKILL);
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	cmprocs[id - 1] = 0;
	reply("ok");
}

/* cmd_objects counts the verbs objects the agent holds, so a client can
 * check that a previous session left nothing behind. */
static void cmd_objects(void)
{
	int pd = 0, mr = 0, cq = 0, qp = 0, srq = 0, mw = 0, ah = 0, cm = 0;
	for (int i = 0; i < MAXCM; i++) {
		if (cmprocs[i] > 0 && waitpid(cmprocs[i], NULL, WNOHANG) == cmprocs[i])
			cmprocs[i] = 0;
		cm += cmprocs[i] > 0;
	}
	for (int i = 0; i < MAXOBJ; i++) {
		pd += pds[i] != NULL;
		mr += mrs[i].mr != NULL;
		cq += cqs[i].cq != NULL;
		qp += qps[i] != NULL;
		srq += srqs[i] != NULL;
		mw += mws[i] != NULL;
		ah += ahs[i] != NULL;
	}
	reply("ok ctx=%d pd=%d mr=%d cq=%d qp=%d srq=%d mw=%d ah=%d cm=%d", ctx != NULL, pd, mr, cq, qp, srq, mw, ah, cm);
}

/* token_equal compares the received token with the agent's in time that
 * does not depend on where they differ: every byte of the agent's token
 * is looked at, whatever the input. */
static int token_equal(const char *got, size_t got_len)
{
	volatile unsigned char d = (unsigned char)(got_len != token_len);
	for (size_t i = 0; i < token_len; i++) {
		unsigned char g = i < got_len ? (unsigned char)got[i] : 0;
		d |= g ^ (unsigned char)token[i];
	}
	return d == 0;
}

/* authenticate reads the first line ("auth TOKEN") byte by byte, bounded
 * in length and time, so an unauthenticated client can neither make the
 * agent allocate nor hold it for long. */
static int authenticate(int fd)
{
	char line[MAXAUTH + 1];
	size_t n = 0;
	struct timeval tv = { .tv_sec = AUTH_TIMEOUT_S };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	for (;;) {
		char ch;
		ssize_t r = recv(fd, &ch, 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		if (ch == '\n')
			break;
		if (n == MAXAUTH)
			return 0;
		line[n++] = ch;
	}
	while (n > 0 && line[n - 1] == '\r')
		n--;
	line[n] = 0;
	/* The command word is public; only the secret goes to token_equal. */
	int is_auth = n >= 5 && memcmp(line, "auth ", 5) == 0;
	int ok = is_auth && token_equal(line + 5, n - 5);
	static const char refused[] = "err refused: the first line must be auth TOKEN with the agent's token\n";
	if (!ok) {
		if (send(fd, refused, sizeof refused - 1, MSG_NOSIGNAL) < 0) { /* closing anyway */ }
		return 0;
	}
	tv.tv_sec = 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	return send(fd, "ok\n", 3, MSG_NOSIGNAL) == 3;
}

static void serve(int fd)
{
	if (!authenticate(fd)) {
		fprintf(stderr, "softroce-agent: connection refused (no or wrong token)\n");
		close(fd);
		return;
	}
	FILE *in = fdopen(fd, "r");
	out = fdopen(fcntl(fd, F_DUPFD_CLOEXEC, 0), "w");
	if (!in || !out) {
		close(fd);
		return;
	}
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	while ((n = getline(&line, &cap, in)) > 0) {
		char *save, *w, *cmd;
		if (n > MAXLINE) {
			reply("err request longer than %d bytes", MAXLINE);
			break;
		}
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = 0;
		cmd = strtok_r(line, " ", &save);
		if (!cmd)
			continue;
		nargs = 0;
		while ((w = strtok_r(NULL, " ", &save)) && nargs < MAXARGS) {
			char *eq = strchr(w, '=');
			if (!eq) { keys[nargs] = w; vals[nargs] = ""; }
			else { *eq = 0; keys[nargs] = w; vals[nargs] = eq + 1; }
			nargs++;
		}
		if (strcmp(cmd, "open") == 0) cmd_open();
		else if (strcmp(cmd, "pd") == 0) cmd_pd();
		else if (strcmp(cmd, "mr") == 0) cmd_mr();
		else if (strcmp(cmd, "cq") == 0) cmd_cq();
		else if (strcmp(cmd, "qp") == 0) cmd_qp();
		else if (strcmp(cmd, "gid") == 0) cmd_gid();
		else if (strcmp(cmd, "init") == 0) cmd_init();
		else if (strcmp(cmd, "rtr") == 0) cmd_rtr();
		else if (strcmp(cmd, "rts") == 0) cmd_rts();
		else if (strcmp(cmd, "udrtr") == 0) cmd_udrtr();
		else if (strcmp(cmd, "udrts") == 0) cmd_udrts();
		else if (strcmp(cmd, "ah") == 0) cmd_ah();
		else if (strcmp(cmd, "state") == 0) cmd_state();
		else if (strcmp(cmd, "query") == 0) cmd_query();
		else if (strcmp(cmd, "send") == 0) cmd_send();
		else if (strcmp(cmd, "recv") == 0) cmd_recv();
		else if (strcmp(cmd, "srq") == 0) cmd_srq();
		else if (strcmp(cmd, "srecv") == 0) cmd_srecv();
		else if (strcmp(cmd, "srqlimit") == 0) cmd_srqlimit();
		else if (strcmp(cmd, "srqmod") == 0) cmd_srqmod();
		else if (strcmp(cmd, "srqquery") == 0) cmd_srqquery();
		else if (strcmp(cmd, "event") == 0) cmd_event();
		else if (strcmp(cmd, "mw") == 0) cmd_mw();
		else if (strcmp(cmd, "bindmw") == 0) cmd_bindmw();
		else if (strcmp(cmd, "localinv") == 0) cmd_localinv();
		else if (strcmp(cmd, "poll") == 0) cmd_poll();
		else if (strcmp(cmd, "mem") == 0) cmd_mem();
		else if (strcmp(cmd, "memw") == 0) cmd_memw();
		else if (strcmp(cmd, "fill") == 0) cmd_fill();
		else if (strcmp(cmd, "devinfo") == 0) cmd_devinfo();
		else if (strcmp(cmd, "objects") == 0) cmd_objects();
		else if (strcmp(cmd, "cmlisten") == 0) cmd_cmlisten();
		else if (strcmp(cmd, "cmconnect") == 0) cmd_cmconnect();
		else if (strcmp(cmd, "cmstop") == 0) cmd_cmstop();
		else if (strcmp(cmd, "destroy") == 0) { destroy_all(); reply("ok"); }
		else if (strcmp(cmd, "ping") == 0) reply("ok");
		else if (strcmp(cmd, "quit") == 0) { reply("ok"); break; }
		else reply("err unknown command %s", cmd);
	}
	free(line);
	/* Whatever ended the session (quit, EOF, a reset, keepalive giving
	 * up on a vanished harness), nothing it created stays on the host. */
	destroy_all();
	fclose(in);
	fclose(out);
}

static int read_token_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "softroce-agent: token file %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (!fgets(token, sizeof token, f))
		token[0] = 0;
	fclose(f);
	token_len = strcspn(token, " \t\r\n");
	token[token_len] = 0;
	if (token_len < 16) {
		fprintf(stderr, "softroce-agent: token file %s: the token must be at least 16 characters on its first line\n", path);
		return -1;
	}
	return 0;
}

static int random_token(void)
{
	unsigned char b[16];
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b) {
		fprintf(stderr, "softroce-agent: read /dev/urandom: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	for (size_t i = 0; i < sizeof b; i++)
		sprintf(token + 2 * i, "%02x", b[i]);
	token_len = 2 * sizeof b;
	return 0;
}

/* listen_on opens the listening socket for "ADDR:PORT", "[V6ADDR]:PORT"
 * or ":PORT" (every address). */
static int listen_on(const char *spec)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	if (!colon || colon[1] == 0) {
		fprintf(stderr, "softroce-agent: --listen %s: want ADDR:PORT\n", spec);
		return -1;
	}
	size_t hl = (size_t)(colon - spec);
	if (hl >= sizeof host) hl = sizeof host - 1;
	memcpy(host, spec, hl);
	host[hl] = 0;
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = 0;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *res;
	int rc = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &res);
	if (rc) {
		fprintf(stderr, "softroce-agent: --listen %s: %s\n", spec, gai_strerror(rc));
		return -1;
	}
	int ls = -1, one = 1;
	for (struct addrinfo *ai = res; ai && ls < 0; ai = ai->ai_next) {
		ls = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (ls < 0)
			continue;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(ls, ai->ai_addr, ai->ai_addrlen) || listen(ls, 4)) {
			close(ls);
			ls = -1;
		}
	}
	freeaddrinfo(res);
	if (ls < 0)
		fprintf(stderr, "softroce-agent: listen on %s: %s\n", spec, strerror(errno));
	return ls;
}

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s --listen ADDR:PORT [--device NAME] [--gid-index N] [--token-file FILE]\n"
		"  --listen ADDR:PORT  TCP address for the harness (\":PORT\": every address; -p PORT is :PORT)\n"
		"  --device NAME       the RDMA device to serve (default: the first one)\n"
		"  --gid-index N       the source GID index of RoCEv2 over IPv4 (default 1)\n"
		"  --token-file FILE   the shared secret, first line (default: a random one, printed)\n"
		"The control channel is authenticated but not encrypted: use it on a lab network.\n",
		prog);
}

int main(int argc, char **argv)
{
	const char *listen_spec = NULL, *token_file = NULL;
	char legacy[32];
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "device", required_argument, NULL, 'd' },
		{ "gid-index", required_argument, NULL, 'g' },
		{ "token-file", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int opt;
	while ((opt = getopt_long(argc, argv, "p:l:d:g:t:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'p':
			snprintf(legacy, sizeof legacy, ":%d", atoi(optarg));
			listen_spec = legacy;
			break;
		case 'l': listen_spec = optarg; break;
		case 'd': cfg_device = optarg; break;
		case 'g': {
			char *end;
			long v = strtol(optarg, &end, 0);
			if (*end || v < 0 || v > 255) { fprintf(stderr, "softroce-agent: bad --gid-index %s\n", optarg); return 2; }
			cfg_gid = (int)v;
			break;
		}
		case 't': token_file = optarg; break;
		case 'h': usage(argv[0]); return 0;
		default: usage(argv[0]); return 2;
		}
	}
	if (!listen_spec || optind != argc) {
		usage(argv[0]);
		return 2;
	}
	if (token_file ? read_token_file(token_file) : random_token())
		return 1;
	signal(SIGPIPE, SIG_IGN);
	int ls = listen_on(listen_spec), one = 1;
	if (ls < 0)
		return 1;
	/* The bound address, so that port 0 (any free port) is usable. */
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	char h[NI_MAXHOST] = "?", sv[NI_MAXSERV] = "?";
	if (getsockname(ls, (struct sockaddr *)&ss, &sl) == 0)
		getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, sv, sizeof sv, NI_NUMERICHOST | NI_NUMERICSERV);
	printf("softroce-agent: listening on %s%s%s:%s, device %s, GID index %d\n", ss.ss_family == AF_INET6 ? "[" : "", h,
	       ss.ss_family == AF_INET6 ? "]" : "", sv, cfg_device ? cfg_device : "(first)", cfg_gid);
	if (!token_file)
		printf("softroce-agent: token %s\n", token);
	fflush(stdout);
	for (;;) {
		int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED) continue;
			perror("softroce-agent: accept");
			return 1;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		/* A harness host that vanishes without closing is noticed within
		 * about a minute, and its objects are then destroyed. */
		int idle = 30, intvl = 10, cnt = 3;
		setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
		setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
		serve(fd);
	}
}
