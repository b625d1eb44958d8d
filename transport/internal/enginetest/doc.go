// Package enginetest runs transport engines in tests: Sim, two engines on
// a deterministic simulated network with loss, duplication, reordering,
// corruption and exact per-packet drop rules, on simulated time so that
// timeouts cost nothing and a seed replays a run exactly; and Wire, two
// engines back to back with no loss and no allocation, for benchmarks and
// allocation tests. Helpers around them register memory, post work
// requests, hand an engine crafted packets and read what it sends back.
//
// It is a package of its own so that the tests of every service package
// (transport/rc, transport/uc, transport/ud) and of transport/engine run
// on the same harness. It imports no service: a test links in the
// services its QPs use (package rc for RC QPs, and so on).
package enginetest
