package route

// Maglev hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network Load
// Balancer", NSDI 2016, section 3.4), with weights as Envoy has them: each member
// walks its own permutation of the table's slots and takes the first free one on its
// turn; a member takes a turn in a round only when its weight has earned it, so it
// ends up with slots in proportion to its weight.

// minMaglevSize is the smallest table: a prime, as the permutations need, and large
// enough that with up to a few hundred members each member's share is within about a
// percent of its weight's.
const minMaglevSize = 65537

// maglevSize returns the table size for n members: the smallest prime from
// minMaglevSize up that is at least 100 slots per member.
func maglevSize(n int) int {
	s := max(minMaglevSize, 100*n)
	for !isPrime(s) {
		s++
	}
	return s
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// buildMaglev fills a table of size slots with indexes into addrs, each member
// taking slots in proportion to its weight.
func buildMaglev(addrs []string, weights []int, size int) []int32 {
	n := len(addrs)
	offset := make([]uint64, n)
	skip := make([]uint64, n)
	next := make([]uint64, n)
	target := make([]int, n)
	maxW := 0
	for i, a := range addrs {
		h := hashString(a)
		offset[i] = h % uint64(size)
		skip[i] = hashString2(a)%uint64(size-1) + 1
		maxW = max(maxW, weights[i])
	}
	table := make([]int32, size)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for round := 1; filled < size; round++ {
		for i := 0; i < n && filled < size; i++ {
			// The member takes a turn once round*weight has caught up with its
			// target, which grows by the largest weight each turn it takes.
			if round*weights[i] < target[i] {
				continue
			}
			target[i] += maxW
			for {
				slot := (offset[i] + next[i]*skip[i]) % uint64(size)
				next[i]++
				if table[slot] < 0 {
					table[slot] = int32(i)
					filled++
					break
				}
			}
		}
	}
	return table
}

// hashBytes is FNV-1a over b, finished with the murmur3 64-bit mixer so that close
// keys (IPs of one subnet) land far apart. It is fixed: every node hashes alike.
func hashBytes(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix64(h)
}

func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix64(h)
}

// hashString2 is a second hash of s, independent enough of hashString for Maglev's
// skip.
func hashString2(s string) uint64 {
	return mix64(hashString(s) ^ 0x9e3779b97f4a7c15)
}

func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
