package sched

import "math/bits"

// IsPrime reports whether n is prime. It is exact for every uint64 (deterministic
// Miller–Rabin with the first twelve prime bases).
func IsPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	small := [...]uint64{2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37}
	for _, p := range small {
		if n%p == 0 {
			return n == p
		}
	}
	// n-1 = d·2^s with d odd.
	d, s := n-1, 0
	for d&1 == 0 {
		d >>= 1
		s++
	}
	for _, a := range small {
		x := powMod(a, d, n)
		if x == 1 || x == n-1 {
			continue
		}
		composite := true
		for range s - 1 {
			x = mulMod(x, x, n)
			if x == n-1 {
				composite = false
				break
			}
		}
		if composite {
			return false
		}
	}
	return true
}

// NextPrime returns the smallest prime ≥ n, or 0 if there is none below 2^64.
func NextPrime(n uint64) uint64 {
	if n <= 2 {
		return 2
	}
	if n&1 == 0 {
		n++
	}
	for ; n >= 3; n += 2 { // n wraps to 1 past the largest odd uint64
		if IsPrime(n) {
			return n
		}
	}
	return 0
}

// mulMod returns a·b mod m without overflow.
func mulMod(a, b, m uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return bits.Rem64(hi, lo, m)
}

// powMod returns b^e mod m.
func powMod(b, e, m uint64) uint64 {
	r := uint64(1)
	b %= m
	for e > 0 {
		if e&1 == 1 {
			r = mulMod(r, b, m)
		}
		b = mulMod(b, b, m)
		e >>= 1
	}
	return r
}
