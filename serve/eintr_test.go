package serve

import "testing"

// A signal ends ibv_get_cq_event, ibv_get_async_event and
// rdma_get_cm_event with EINTR, as with rdma-core on the kernel
// (testdata/eintr.c): qperf's latency tests stop their loop, blocked in
// ibv_get_cq_event, by SIGALRM.
func TestSignalEndsWait(t *testing.T) { runCM(t, "eintr.c") }
