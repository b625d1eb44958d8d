//go:build race

package rc

const raceEnabled = true
