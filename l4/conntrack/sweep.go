package conntrack

// Sweep visits n positions of the table's entries from position from (1 to begin a
// sweep), in storage order, calls drop with the key of each entry in use, and removes
// those for which drop returns true. It returns the position to go on from, or 0 once
// the sweep has passed the last entry, and how many entries it removed. A packet loop
// that must apply a new rule to the connections it already has (a blacklist that
// changed) calls it once per iteration with a small n, spreading the work as Expire
// does; a whole sweep visits the entries handed out so far, at most the capacity.
// Entries inserted during a sweep may be visited or not. drop must not use the table.
func (t *Table) Sweep(from uint32, n int, drop func(k *Key) bool) (next uint32, removed int) {
	if from == 0 {
		from = 1
	}
	i := from
	for end := min(t.used, from+uint32(max(n, 0))-1); i <= end; i++ {
		if t.entries[i].state != 0 && drop(&t.entries[i].key) {
			t.remove(i)
			removed++
		}
	}
	if i > t.used {
		return 0, removed
	}
	return i, removed
}
