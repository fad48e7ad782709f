//go:build race

package l7

// raceEnabled: the race detector is on. sync.Pool then drops what it is given at
// random, so allocation counts say nothing.
const raceEnabled = true
