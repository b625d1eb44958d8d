/*
 * Finding and checking the daemon, shared by libibverbs.so.1 (verbs.c) and
 * librdmacm.so.1 (rdmacm.c); serve/dial.go is the same in Go.
 *
 * The socket is $SOFTROCE_SOCKET, else the default socket of the daemon's
 * uid in this network namespace: /run/softroce/softroce-net<INODE>.sock
 * for root, else $TMPDIR/softroce-<UID>/softroce-net<INODE>.sock ($TMPDIR
 * defaults to /tmp), INODE being that of /proc/self/ns/net and the
 * daemon's uid $SOFTROCE_DAEMON_UID (a uid or a user name) if set, else
 * the caller's own. Before any request, sr_dial checks that the daemon
 * runs as the caller, root or $SOFTROCE_DAEMON_UID (SO_PEERCRED), and
 * that its HELLO names the caller's network namespace; a daemon that fails
 * either is refused with one line on stderr, as if there were none.
 */
#ifndef SOFTROCE_SOCK_H
#define SOFTROCE_SOCK_H

#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "softroce_proto.h"

/* sr_daemon_uid: 1 and *uid when $SOFTROCE_DAEMON_UID names a user, 0
 * when it is unset, -1 when it names nobody. */
static int sr_daemon_uid(uid_t *uid)
{
	const char *v = getenv("SOFTROCE_DAEMON_UID");
	struct passwd pw, *r = NULL;
	char buf[1024], *end;
	unsigned long n;

	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (!*end && !errno && n <= UINT32_MAX && *v != '-') {
		*uid = (uid_t)n;
		return 1;
	}
	if (getpwnam_r(v, &pw, buf, sizeof(buf), &r) == 0 && r) {
		*uid = r->pw_uid;
		return 1;
	}
	return -1;
}

/* sr_netns: the calling thread's network namespace; false if unknown. */
static bool sr_netns(uint64_t *dev, uint64_t *ino)
{
	struct stat st;

	if (stat("/proc/thread-self/ns/net", &st) && stat("/proc/self/ns/net", &st))
		return false;
	*dev = st.st_dev;
	*ino = st.st_ino;
	return true;
}

/* sr_socket_path: false when the path does not fit buf (a cut path would
 * name another file). */
static bool sr_socket_path(char *buf, size_t n)
{
	const char *p = getenv("SOFTROCE_SOCKET");
	const char *t = getenv("TMPDIR");
	char name[64];
	uint64_t dev, ino;
	uid_t uid = geteuid();
	int k;

	if (p && *p) {
		k = snprintf(buf, n, "%s", p);
		return k >= 0 && (size_t)k < n;
	}
	sr_daemon_uid(&uid);
	if (sr_netns(&dev, &ino))
		snprintf(name, sizeof(name), "softroce-net%llu.sock", (unsigned long long)ino);
	else
		snprintf(name, sizeof(name), "softroce.sock");
	if (uid == 0)
		k = snprintf(buf, n, "/run/softroce/%s", name);
	else
		k = snprintf(buf, n, "%s/softroce-%u/%s", t && *t ? t : "/tmp", (unsigned)uid, name);
	return k >= 0 && (size_t)k < n;
}

/* sr_refuse prints why a daemon is refused, once per process: a program
 * connects many times and one line says it. */
__attribute__((format(printf, 1, 2))) static void sr_refuse(const char *fmt, ...)
{
	static int said;
	va_list ap;

	if (__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
		return;
	va_start(ap, fmt);
	fputs("softroce: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* sr_peer_ok: the daemon on fd runs as us, root or $SOFTROCE_DAEMON_UID. */
static bool sr_peer_ok(int fd, const char *path)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	uid_t me = geteuid(), named = 0;
	int k;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
		sr_refuse("refusing the daemon on %s: its credentials: %s", path, strerror(errno));
		return false;
	}
	if (cr.uid == me || cr.uid == 0)
		return true;
	k = sr_daemon_uid(&named);
	if (k == 1 && cr.uid == named)
		return true;
	if (k < 0)
		sr_refuse("refusing the daemon on %s: it runs as uid %u and SOFTROCE_DAEMON_UID=%s names no user; "
			  "set SOFTROCE_DAEMON_UID=%u if you trust that user's daemon",
			  path, (unsigned)cr.uid, getenv("SOFTROCE_DAEMON_UID"), (unsigned)cr.uid);
	else
		sr_refuse("refusing the daemon on %s: it runs as uid %u, not as you (uid %u) or root; "
			  "set SOFTROCE_DAEMON_UID=%u if you trust that user's daemon",
			  path, (unsigned)cr.uid, (unsigned)me, (unsigned)cr.uid);
	return false;
}

/*
 * sr_dial connects to the daemon, checks who it is and says HELLO. The
 * HELLO answer (struct sr_hello_resp and the device entries) goes to
 * hello (n bytes at most, *got set) when hello is not NULL. It returns
 * the socket, or -1 with errno ENODEV when there is no daemon it may use.
 */
static int sr_dial(void *hello, size_t n, size_t *got)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct {
		struct sr_req h;
		struct sr_hello_req b;
	} req = { .h = { .op = SR_OP_HELLO }, .b = { .version = SR_PROTO_VERSION } };
	char in[SR_MAX_MSG + 1];
	struct sr_resp r;
	struct sr_hello_resp h;
	uint64_t dev, ino;
	ssize_t k;
	int fd;

	if (!sr_socket_path(a.sun_path, sizeof(a.sun_path))) {
		sr_refuse("the daemon's socket path is longer than a Unix socket's %zu bytes; set SOFTROCE_SOCKET or a shorter TMPDIR",
			  sizeof(a.sun_path) - 1);
		errno = ENODEV;
		return -1;
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		if (getenv("SOFTROCE_DEBUG"))
			fprintf(stderr, "softroce: no daemon on %s: %s\n", a.sun_path, strerror(errno));
		goto fail;
	}
	if (!sr_peer_ok(fd, a.sun_path))
		goto fail;
	if (send(fd, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req))
		goto fail;
	do
		k = recv(fd, in, sizeof(in), 0);
	while (k < 0 && errno == EINTR);
	if (k < (ssize_t)(sizeof(r) + sizeof(h))) {
		if (k < (ssize_t)sizeof(r) && getenv("SOFTROCE_DEBUG"))
			fprintf(stderr, "softroce: the daemon on %s answered HELLO with %zd bytes: %s\n", a.sun_path, k,
				k < 0 ? strerror(errno) : "closed");
		if (k >= (ssize_t)sizeof(r)) {
			memcpy(&r, in, sizeof(r));
			if (r.err)
				sr_refuse("the daemon on %s refused HELLO of protocol version %d (%s): "
					  "restart it from the softroce this library comes from",
					  a.sun_path, SR_PROTO_VERSION, strerror(r.err));
		}
		goto fail;
	}
	memcpy(&r, in, sizeof(r));
	memcpy(&h, in + sizeof(r), sizeof(h));
	if (r.err)
		goto fail;
	if ((h.net_dev || h.net_ino) && sr_netns(&dev, &ino) && (h.net_dev != dev || h.net_ino != ino)) {
		sr_refuse("refusing the daemon on %s: it serves network namespace net:[%llu] and this program is in "
			  "net:[%llu]; start a daemon in this namespace (softroce serve) or point SOFTROCE_SOCKET at the one that serves it",
			  a.sun_path, (unsigned long long)h.net_ino, (unsigned long long)ino);
		goto fail;
	}
	if (hello) {
		size_t m = (size_t)k - sizeof(r);
		if (m > n)
			m = n;
		memcpy(hello, in + sizeof(r), m);
		*got = m;
	}
	return fd;
fail:
	close(fd);
	errno = ENODEV;
	return -1;
}

#endif
