//go:build !race

package l7

const raceEnabled = false
