//go:build race

package enginetest

// RaceEnabled says whether the race detector is on: tests that run many
// seeded workloads run fewer under it, as each one is much slower.
const RaceEnabled = true
