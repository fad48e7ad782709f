package sched

import "testing"

func TestIsPrime(t *testing.T) {
	// Trial division up to 10,000 is the reference.
	for n := uint64(0); n < 10000; n++ {
		want := n >= 2
		for d := uint64(2); d*d <= n; d++ {
			if n%d == 0 {
				want = false
				break
			}
		}
		if got := IsPrime(n); got != want {
			t.Fatalf("IsPrime(%d) = %v, want %v", n, got, want)
		}
	}
	tests := []struct {
		n    uint64
		want bool
	}{
		{65537, true},
		{65539, true},
		{65541, false},
		{1000003, true},
		{3215031751, false},           // strong pseudoprime to bases 2, 3, 5, 7
		{3825123056546413051, false},  // strong pseudoprime to bases 2..23
		{18446744073709551557, true},  // largest 64-bit prime
		{18446744073709551615, false}, // 2^64-1
		{4294967291, true},            // largest 32-bit prime
		{4294967297, false},           // 2^32+1 = 641 × 6700417
	}
	for _, tc := range tests {
		if got := IsPrime(tc.n); got != tc.want {
			t.Errorf("IsPrime(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestNextPrime(t *testing.T) {
	tests := []struct{ n, want uint64 }{
		{0, 2}, {1, 2}, {2, 2}, {3, 3}, {4, 5}, {14, 17},
		{65536, 65537}, {65537, 65537}, {65538, 65539},
		{18446744073709551557, 18446744073709551557},
		{18446744073709551558, 0},
		{18446744073709551615, 0},
	}
	for _, tc := range tests {
		if got := NextPrime(tc.n); got != tc.want {
			t.Errorf("NextPrime(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestDefaultMaglevSize(t *testing.T) {
	tests := []struct {
		members int
		want    uint64
	}{
		{0, 65537}, {1, 65537}, {100, 65537}, {256, 65537},
		{257, NextPrime(257 * 256)}, {1000, NextPrime(256000)},
	}
	for _, tc := range tests {
		got := DefaultMaglevSize(tc.members)
		if got != tc.want || !IsPrime(got) || got < 100*uint64(tc.members) {
			t.Errorf("DefaultMaglevSize(%d) = %d, want prime %d", tc.members, got, tc.want)
		}
	}
}
