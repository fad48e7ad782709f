package conntrack

// Session sync (l4/sessionsync) between the load distributors of a cluster needs four
// things of a table, all on the goroutine that owns it:
//
//   - the state changes and deletions of its entries (EnableEvents, Events), so the
//     owner can send a connection once it has lived sync_after, and its later changes;
//   - to mark an entry sent and read it in one probe (MarkSent);
//   - to install an entry received from a peer (Install), marked synced, and remove
//     one a peer deleted (RemoveSynced);
//   - to walk every entry for a full sync (Walk).
//
// An entry's flags live in the byte its layout left free, so the entry stays 40 bytes
// and a packet of an established flow does no more work than without sync.

// Entry flags.
const (
	// flagSent: the entry lived sync_after and was sent to the peers.
	flagSent = 1 << 0
	// flagSynced: the entry was received from a peer.
	flagSynced = 1 << 1
)

// Event is a state change or a deletion of an entry, recorded when events are
// enabled.
type Event struct {
	// Key is the entry's key and Hash the hash it was filed with.
	Key  Key
	Hash uint64
	// State is the entry's new state; zero for a deletion.
	State State
	// Shared says the entry had been sent to the peers or received from one, so
	// that its peers hold a copy which this change concerns.
	Shared bool
}

// eventRing is a bounded FIFO of events; when full, new events are dropped and
// counted (a full sync repairs what they would have said).
type eventRing struct {
	buf     []Event
	head, n int
	dropped uint64
}

// EnableEvents makes the table record, from now on and up to capacity of them
// between two calls of Events, every state change a packet makes (LookupTCP,
// LookupReply) and every Delete of an entry that was sent or synced. capacity ≤ 0
// disables them.
func (t *Table) EnableEvents(capacity int) {
	if capacity <= 0 {
		t.events = nil
		return
	}
	t.events = &eventRing{buf: make([]Event, capacity)}
}

// note records an event about entry i (a deletion when del).
func (t *Table) note(i uint32, hash uint64, del bool) {
	r := t.events
	if r.n == len(r.buf) {
		r.dropped++
		return
	}
	e := &t.entries[i]
	ev := &r.buf[(r.head+r.n)%len(r.buf)]
	ev.Key, ev.Hash, ev.Shared = e.key, hash, e.flags != 0
	ev.State = e.state
	if del {
		ev.State = 0
	}
	r.n++
}

// Events appends the events recorded since the last call to dst, oldest first, and
// returns it with how many events were dropped because the buffer was full.
func (t *Table) Events(dst []Event) ([]Event, uint64) {
	r := t.events
	if r == nil || r.n == 0 {
		return dst, 0
	}
	for ; r.n > 0; r.n-- {
		dst = append(dst, r.buf[r.head])
		r.head = (r.head + 1) % len(r.buf)
	}
	d := r.dropped
	r.dropped = 0
	return dst, d
}

// PendingEvents reports whether events wait to be read.
func (t *Table) PendingEvents() bool { return t.events != nil && t.events.n > 0 }

// MarkSent finds k's live entry, marks it sent and returns its member, state and
// expiry. It does not refresh the entry.
func (t *Table) MarkSent(k *Key, hash uint64, now uint32) (member uint16, state State, expire uint32, ok bool) {
	i, _, _ := t.find(k, hash)
	if i == 0 {
		return 0, 0, 0, false
	}
	e := &t.entries[i]
	if expired(now, e.expire) {
		return 0, 0, 0, false
	}
	e.flags |= flagSent
	return e.member, e.state, e.expire, true
}

// Install puts an entry received from a peer in the table, marked synced: k →
// member in state st, expiring ttl seconds after now. An entry of k that is absent,
// synced, or unconfirmed (a flow this LD picked up mid-way and scheduled itself) is
// replaced; one this LD made from the flow's start (any other state, not synced) is
// kept, since this LD is the one forwarding the flow. Install reports whether the
// table now holds the received entry; it fails when the state is not one a peer
// sends (established, fin, close, udp) or the table is full.
func (t *Table) Install(k *Key, hash uint64, member uint16, st State, ttl, now uint32) bool {
	switch st {
	case StateEstablished, StateFin, StateClose, StateUDP:
	default:
		return false
	}
	if i, link, plink := t.find(k, hash); i != 0 {
		e := &t.entries[i]
		if !expired(now, e.expire) && e.flags&flagSynced == 0 && e.state != StateUnconfirmed {
			return false
		}
		t.unlink(i, link, plink)
		t.release(i)
	}
	if _, ok := t.Insert(k, hash, member, st, now); !ok {
		return false
	}
	i, _, _ := t.find(k, hash)
	e := &t.entries[i]
	e.flags = flagSynced
	if ttl != t.timeouts[st] {
		t.unfile(i)
		e.expire = now + min(ttl, uint32(MaxTimeout.Seconds()))
		t.file(i)
	}
	return true
}

// RemoveSynced deletes k's entry if it was received from a peer, and reports
// whether it did; an entry this LD made is left alone.
func (t *Table) RemoveSynced(k *Key, hash uint64) bool {
	i, link, plink := t.find(k, hash)
	if i == 0 || t.entries[i].flags&flagSynced == 0 {
		return false
	}
	t.unlink(i, link, plink)
	t.release(i)
	return true
}

// View is what Walk shows of an entry.
type View struct {
	Key    Key
	Member uint16
	State  State
	// Expire is the table time (Clock) after which the entry is dead.
	Expire uint32
	// Sent says the entry lived sync_after and was sent; Synced that it was
	// received from a peer.
	Sent, Synced bool
	// MarkSent, set by Walk's fn, marks the entry sent.
	MarkSent bool
	// Proxy is the entry's SYN proxy state (Flags 0: not proxied).
	Proxy Proxy
}

// Walk visits up to n positions of the table's entries from position from (1 to
// begin), in storage order, and calls fn with each live entry at now. fn returns
// false to stop before that entry is counted as visited: the walk resumes there;
// it sets the view's MarkSent to mark the entry sent.
// Walk returns the position to go on from, or 0 once it has passed the last entry.
// Entries inserted during a walk may be visited or not. fn must not use the table.
func (t *Table) Walk(from uint32, n int, now uint32, fn func(v *View) bool) (next uint32) {
	if from == 0 {
		from = 1
	}
	i := from
	var v View
	for end := min(t.used, from+uint32(max(n, 0))-1); i <= end; i++ {
		e := &t.entries[i]
		if e.state == 0 || expired(now, e.expire) {
			continue
		}
		v = View{Key: e.key, Member: e.member, State: e.state, Expire: e.expire,
			Sent: e.flags&flagSent != 0, Synced: e.flags&flagSynced != 0}
		if t.proxy != nil {
			v.Proxy = t.proxy[i]
		}
		if !fn(&v) {
			return i
		}
		if v.MarkSent {
			e.flags |= flagSent
		}
	}
	if i > t.used {
		return 0
	}
	return i
}
