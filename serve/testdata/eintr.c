/* A signal ends a blocking wait with EINTR (testdata of TestSignalEndsWait),
 * as rdma-core's reads of the kernel's uverbs and ucma descriptors do:
 * programs such as qperf end a timed loop blocked in ibv_get_cq_event by
 * SIGALRM (a handler without SA_RESTART) and stop on Finished && EINTR. */
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>
#include "cm_common.h"

static volatile sig_atomic_t fired;

/* on_alarm counts; a wait that restarts after the signal is caught by the
 * interval timer firing on: after 2 s the program fails. */
static void on_alarm(int sig)
{
	static const char msg[] = "a signal did not end the wait\n";
	(void)sig;
	if (++fired > 20) {
		write(1, msg, sizeof(msg) - 1);
		_exit(1);
	}
}

/* arm fires SIGALRM 100 ms from now and every 100 ms after. */
static void arm(void)
{
	struct itimerval it = { .it_value = { .tv_usec = 100000 }, .it_interval = { .tv_usec = 100000 } };
	CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
}

static void disarm(void)
{
	struct itimerval it = { 0 };
	CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
	fired = 0;
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART */
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq, *ecq;
	struct ibv_async_event ae;
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev;
	void *ectx;

	CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
	CHECK((list = ibv_get_device_list(NULL)) != NULL && list[0] != NULL);
	CHECK((ctx = ibv_open_device(list[0])) != NULL);
	CHECK((cc = ibv_create_comp_channel(ctx)) != NULL);
	CHECK((cq = ibv_create_cq(ctx, 4, NULL, cc, 0)) != NULL);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);

	arm();
	errno = 0;
	CHECK(ibv_get_cq_event(cc, &ecq, &ectx) == -1 && errno == EINTR);
	disarm();
	arm();
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EINTR);
	disarm();
	CHECK((ch = rdma_create_event_channel()) != NULL);
	arm();
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EINTR);
	disarm();

	rdma_destroy_event_channel(ch);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(cc) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
