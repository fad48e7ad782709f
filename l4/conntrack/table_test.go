package conntrack

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

const (
	fin = flagFIN
	syn = flagSYN
	rst = flagRST
	ack = flagACK
	psh = 0x08
)

func newTable(t testing.TB, capacity int) *Table {
	t.Helper()
	tb, err := New(Config{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func mustCheck(t testing.TB, tb *Table, hash func(*Key) uint64) {
	t.Helper()
	if err := tb.check(hash); err != nil {
		t.Fatal(err)
	}
}

func insert(t testing.TB, tb *Table, k Key, member uint16, st State, now uint32) {
	t.Helper()
	if ev, ok := tb.Insert(&k, testHash(&k), member, st, now); !ok || ev {
		t.Fatalf("Insert(%v) = evicted %v, ok %v", k, ev, ok)
	}
}

func TestEntrySize(t *testing.T) {
	if s := EntrySize(); s > 40 {
		t.Fatalf("entry is %d bytes, want ≤ 40", s)
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"zero capacity", Config{}, ErrCapacity},
		{"negative capacity", Config{Capacity: -1}, ErrCapacity},
		{"huge capacity", Config{Capacity: MaxCapacity + 1}, ErrCapacity},
		{"negative timeout", Config{Capacity: 1, Timeouts: Timeouts{Fin: config.Duration(-time.Second)}}, ErrTimeout},
		{"huge timeout", Config{Capacity: 1, Timeouts: Timeouts{UDP: config.Duration(MaxTimeout + 1)}}, ErrTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tb, err := New(tc.cfg); !errors.Is(err, tc.want) || tb != nil {
				t.Fatalf("New = %v, %v; want %v", tb, err, tc.want)
			}
		})
	}
}

func TestTimeoutDefaultsAndRounding(t *testing.T) {
	tb := newTable(t, 1)
	want := [numStates]uint32{0, 30, 900, 60, 10, 300, 10}
	if tb.timeouts != want {
		t.Fatalf("default timeouts %v, want %v", tb.timeouts, want)
	}
	tb, err := New(Config{Capacity: 1, Timeouts: Timeouts{
		SynRecv: config.Duration(1500 * time.Millisecond), Established: config.Duration(time.Nanosecond), Fin: config.Duration(2 * time.Second),
	}})
	if err != nil {
		t.Fatal(err)
	}
	want = [numStates]uint32{0, 2, 1, 2, 10, 300, 10}
	if tb.timeouts != want {
		t.Fatalf("timeouts %v, want %v", tb.timeouts, want)
	}
}

func TestInsertLookupDelete(t *testing.T) {
	tb := newTable(t, 100)
	v4 := Key{Client: netip.MustParseAddr("192.0.2.7").As16(), ClientPort: 40000, Rule: 3}
	v6 := Key{Client: netip.MustParseAddr("2001:db8::7").As16(), ClientPort: 40000, Rule: 3}
	otherRule := v4
	otherRule.Rule = 4
	otherPort := v4
	otherPort.ClientPort = 40001

	insert(t, tb, v4, 11, StateEstablished, 100)
	insert(t, tb, v6, 12, StateUDP, 100)
	for _, tc := range []struct {
		k      Key
		member uint16
		state  State
		ok     bool
	}{
		{v4, 11, StateEstablished, true},
		{v6, 12, StateUDP, true},
		{otherRule, 0, 0, false},
		{otherPort, 0, 0, false},
	} {
		m, s, ok := tb.Lookup(&tc.k, testHash(&tc.k), 100)
		if m != tc.member || s != tc.state || ok != tc.ok {
			t.Errorf("Lookup(%v) = %d, %v, %v; want %d, %v, %v", tc.k, m, s, ok, tc.member, tc.state, tc.ok)
		}
	}
	if tb.Len() != 2 || tb.Cap() != 100 || tb.MemberConns(11) != 1 || tb.MemberConns(12) != 1 {
		t.Fatalf("Len %d Cap %d conns %d %d", tb.Len(), tb.Cap(), tb.MemberConns(11), tb.MemberConns(12))
	}
	mustCheck(t, tb, testHash)
	if !tb.Delete(&v4, testHash(&v4)) {
		t.Fatal("Delete of a present key = false")
	}
	if tb.Delete(&v4, testHash(&v4)) {
		t.Fatal("second Delete = true")
	}
	if _, _, ok := tb.Lookup(&v4, testHash(&v4), 100); ok {
		t.Fatal("deleted key still found")
	}
	if tb.Len() != 1 || tb.MemberConns(11) != 0 {
		t.Fatalf("after Delete: Len %d conns %d", tb.Len(), tb.MemberConns(11))
	}
	mustCheck(t, tb, testHash)
	// The freed entry is reused.
	insert(t, tb, v4, 13, StateSynRecv, 101)
	if m, s, ok := tb.Lookup(&v4, testHash(&v4), 101); !ok || m != 13 || s != StateSynRecv {
		t.Fatalf("reinserted: %d %v %v", m, s, ok)
	}
	if tb.used != 2 {
		t.Fatalf("%d entries used, want the freed one reused", tb.used)
	}
	mustCheck(t, tb, testHash)
}

func TestTCPTransitions(t *testing.T) {
	S, E, F, C, U := StateSynRecv, StateEstablished, StateFin, StateClose, StateUnconfirmed
	tests := []struct {
		from  State
		flags uint8
		to    State
	}{
		{S, syn, S}, {S, ack, E}, {S, psh | ack, E}, {S, fin | ack, F}, {S, rst, C}, {S, rst | ack, C},
		{S, 0, S}, {S, syn | ack, S},
		{E, ack, E}, {E, psh | ack, E}, {E, syn, E}, {E, fin | ack, F}, {E, fin, F}, {E, rst, C}, {E, 0, E},
		{F, ack, F}, {F, fin | ack, F}, {F, rst, C}, {F, syn, S},
		{C, ack, C}, {C, fin, C}, {C, rst, C}, {C, syn, S},
		{StateUDP, syn, StateUDP}, {StateUDP, rst, StateUDP},
		{U, ack, U}, {U, psh | ack, U}, {U, fin | ack, U}, {U, fin, U}, {U, 0, U},
		{U, syn, S}, {U, rst, C}, {U, rst | ack, C},
	}
	for _, tc := range tests {
		t.Run(tc.from.String()+"/"+flagNames(tc.flags), func(t *testing.T) {
			tb := newTable(t, 4)
			k := testKey(1)
			insert(t, tb, k, 7, tc.from, 1000)
			m, ok := tb.LookupTCP(&k, testHash(&k), tc.flags, 1005)
			if !ok || m != 7 {
				t.Fatalf("LookupTCP = %d, %v", m, ok)
			}
			_, s, _ := tb.Lookup(&k, testHash(&k), 1005)
			if s != tc.to {
				t.Fatalf("state %v, want %v", s, tc.to)
			}
			// The expiry is refreshed for the new state.
			if got, want := tb.entries[tb.used].expire, 1005+tb.timeouts[tc.to]; got != want {
				t.Fatalf("expiry %d, want %d", got, want)
			}
			if want := 0; tc.to == S {
				want = 1
				if tb.HalfOpen() != want {
					t.Fatalf("HalfOpen %d, want %d", tb.HalfOpen(), want)
				}
			} else if tb.HalfOpen() != want {
				t.Fatalf("HalfOpen %d, want %d", tb.HalfOpen(), want)
			}
			if want := b2i(tc.to == U); tb.Unconfirmed() != want {
				t.Fatalf("Unconfirmed %d, want %d", tb.Unconfirmed(), want)
			}
			mustCheck(t, tb, testHash)
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func flagNames(f uint8) string {
	s := ""
	for _, n := range []struct {
		bit  uint8
		name string
	}{{syn, "S"}, {ack, "A"}, {fin, "F"}, {rst, "R"}, {psh, "P"}} {
		if f&n.bit != 0 {
			s += n.name
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// TestExpiryByState checks each state's timeout with a fake clock: alive through
// now = refresh+timeout, gone one second later, and reclaimed by Expire.
func TestExpiryByState(t *testing.T) {
	tb, err := New(Config{Capacity: 16, Timeouts: Timeouts{
		SynRecv: config.Duration(5 * time.Second), Established: config.Duration(50 * time.Second), Fin: config.Duration(7 * time.Second),
		Close: config.Duration(3 * time.Second), UDP: config.Duration(20 * time.Second), Unconfirmed: config.Duration(4 * time.Second),
	}})
	if err != nil {
		t.Fatal(err)
	}
	timeout := map[State]uint32{StateSynRecv: 5, StateEstablished: 50, StateFin: 7, StateClose: 3, StateUDP: 20, StateUnconfirmed: 4}
	const start = 4_000_000_000 // near the uint32 wrap: times wrap during the test
	for s := StateSynRecv; s <= StateUnconfirmed; s++ {
		k := testKey(int(s))
		insert(t, tb, k, uint16(s), s, start)
	}
	for now := uint32(start); now != start+60; now++ {
		if n := tb.Expire(now, 64); n > 1 {
			t.Fatalf("now=start+%d: Expire reclaimed %d at once", now-start, n)
		}
		for s := StateSynRecv; s <= StateUnconfirmed; s++ {
			k := testKey(int(s))
			alive := now-start <= timeout[s]
			// Lookup would reclaim; peek at the chain instead.
			i, _, _ := tb.find(&k, testHash(&k))
			if alive && (i == 0 || expired(now, tb.entries[i].expire)) {
				t.Fatalf("%v: gone at start+%d, timeout %d", s, now-start, timeout[s])
			}
			if !alive && i != 0 {
				t.Fatalf("%v: still in the table at start+%d after Expire, timeout %d", s, now-start, timeout[s])
			}
		}
		mustCheck(t, tb, testHash)
	}
	if tb.Len() != 0 || tb.Stats().Expired != 6 {
		t.Fatalf("Len %d, Expired %d", tb.Len(), tb.Stats().Expired)
	}
}

func TestRefreshKeepsAlive(t *testing.T) {
	tb := newTable(t, 16)
	tcp, udp := testKey(1), testKey(2)
	insert(t, tb, tcp, 1, StateEstablished, 0)
	insert(t, tb, udp, 2, StateUDP, 0)
	// A packet every 100 s keeps both alive for 10,000 s, while Expire runs every second.
	for now := uint32(1); now <= 10_000; now++ {
		if now%100 == 0 {
			if _, ok := tb.LookupTCP(&tcp, testHash(&tcp), ack, now); !ok {
				t.Fatalf("TCP flow lost at %d", now)
			}
			if _, ok := tb.LookupUDP(&udp, testHash(&udp), now); !ok {
				t.Fatalf("UDP flow lost at %d", now)
			}
		}
		tb.Expire(now, 8)
	}
	mustCheck(t, tb, testHash)
	// Then silence: UDP goes after 300 s, TCP after 900 s.
	for now := uint32(10_001); now <= 11_000; now++ {
		tb.Expire(now, 8)
		_, _, udpOK := tb.Lookup(&udp, testHash(&udp), now)
		_, _, tcpOK := tb.Lookup(&tcp, testHash(&tcp), now)
		if udpOK != (now <= 10_300) || tcpOK != (now <= 10_900) {
			t.Fatalf("at %d: udp %v tcp %v", now, udpOK, tcpOK)
		}
	}
	if tb.Len() != 0 {
		t.Fatalf("Len %d", tb.Len())
	}
}

func TestExpiredCountsAsAbsent(t *testing.T) {
	for _, op := range []string{"Lookup", "LookupTCP", "LookupUDP"} {
		tb := newTable(t, 4)
		k := testKey(9)
		insert(t, tb, k, 3, StateClose, 100) // expires at 110
		var ok bool
		switch op {
		case "Lookup":
			_, _, ok = tb.Lookup(&k, testHash(&k), 111)
		case "LookupTCP":
			_, ok = tb.LookupTCP(&k, testHash(&k), ack, 111)
		case "LookupUDP":
			_, ok = tb.LookupUDP(&k, testHash(&k), 111)
		}
		if ok || tb.Len() != 0 || tb.MemberConns(3) != 0 || tb.Stats().Expired != 1 {
			t.Fatalf("%s of an expired entry: ok %v, Len %d, conns %d, stats %+v",
				op, ok, tb.Len(), tb.MemberConns(3), tb.Stats())
		}
		mustCheck(t, tb, testHash)
	}
}

// TestSYNFlood fills the table with half-open entries: each new one evicts the least
// recently seen half-open entry, established entries are never evicted, and a table
// holding only established entries refuses inserts.
func TestSYNFlood(t *testing.T) {
	const capacity = 100
	tb := newTable(t, capacity)
	// 10 established connections, then 90 half-open.
	for i := range 10 {
		insert(t, tb, testKey(i), 1, StateEstablished, 0)
	}
	for i := 10; i < capacity; i++ {
		insert(t, tb, testKey(i), 2, StateSynRecv, uint32(i/10))
	}
	// A retransmitted SYN makes entry 10 the most recently seen.
	k10 := testKey(10)
	if _, ok := tb.LookupTCP(&k10, testHash(&k10), syn, 9); !ok {
		t.Fatal("entry 10 missing")
	}
	// Each flood SYN evicts the oldest half-open: 11, 12, ... then 10.
	var evictedOrder []int
	for n := range 200 {
		k := testKey(1000 + n)
		present := map[int]bool{}
		for i := 10; i < capacity; i++ {
			ki := testKey(i)
			_, _, present[i] = tb.Lookup(&ki, testHash(&ki), 10)
		}
		ev, ok := tb.Insert(&k, testHash(&k), 3, StateSynRecv, 10)
		if !ok || !ev {
			t.Fatalf("flood insert %d: evicted %v ok %v", n, ev, ok)
		}
		for i := 10; i < capacity; i++ {
			ki := testKey(i)
			if _, _, ok := tb.Lookup(&ki, testHash(&ki), 10); present[i] && !ok {
				evictedOrder = append(evictedOrder, i)
			}
		}
		if tb.Len() != capacity || tb.HalfOpen() != capacity-10 {
			t.Fatalf("Len %d HalfOpen %d", tb.Len(), tb.HalfOpen())
		}
	}
	for j, i := range evictedOrder[:capacity-10] {
		want := 11 + j
		if j == capacity-11 {
			want = 10
		}
		if i != want {
			t.Fatalf("eviction %d took entry %d, want %d (order %v)", j, i, want, evictedOrder)
		}
	}
	for i := range 10 {
		k := testKey(i)
		if _, _, ok := tb.Lookup(&k, testHash(&k), 10); !ok {
			t.Fatalf("established entry %d evicted", i)
		}
	}
	if st := tb.Stats(); st.Evictions != 200 || st.InsertFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
	if tb.MemberConns(2) != 0 || tb.MemberConns(3) != capacity-10 || tb.MemberConns(1) != 10 {
		t.Fatalf("member counts %d %d %d", tb.MemberConns(1), tb.MemberConns(2), tb.MemberConns(3))
	}
	mustCheck(t, tb, testHash)

	// Complete every handshake: now nothing can be evicted.
	for n := range 200 {
		k := testKey(1000 + n)
		tb.LookupTCP(&k, testHash(&k), ack, 11)
	}
	if tb.HalfOpen() != 0 {
		t.Fatalf("HalfOpen %d", tb.HalfOpen())
	}
	k := testKey(5000)
	if ev, ok := tb.Insert(&k, testHash(&k), 3, StateSynRecv, 12); ok || ev {
		t.Fatalf("insert into a table full of established entries: evicted %v ok %v", ev, ok)
	}
	if st := tb.Stats(); st.InsertFailures != 1 {
		t.Fatalf("stats %+v", st)
	}
	mustCheck(t, tb, testHash)
	// Once the FIN timeouts pass, expired entries make room again.
	for i := range 10 {
		k := testKey(i)
		tb.LookupTCP(&k, testHash(&k), fin|ack, 12) // 60 s
	}
	if _, ok := tb.Insert(&k, testHash(&k), 3, StateSynRecv, 72); ok {
		t.Fatal("insert succeeded before any entry expired")
	}
	if ev, ok := tb.Insert(&k, testHash(&k), 3, StateSynRecv, 73); !ok || ev {
		t.Fatalf("insert after FIN timeouts: evicted %v ok %v", ev, ok)
	}
	mustCheck(t, tb, testHash)
}

// TestUnconfirmedFlood fills the table with unconfirmed entries (spoofed mid-flow
// packets) among half-open ones: new entries evict the least recently seen unconfirmed
// entry first, then half-open ones; a reply confirms an entry, which is then safe.
func TestUnconfirmedFlood(t *testing.T) {
	const capacity = 8
	tb := newTable(t, capacity)
	insert(t, tb, testKey(0), 1, StateSynRecv, 0)
	for i := 1; i < capacity; i++ {
		insert(t, tb, testKey(i), 1, StateUnconfirmed, 0)
	}
	// Entry 1 is seen again: it is now the most recently seen unconfirmed entry.
	k1 := testKey(1)
	if _, ok := tb.LookupTCP(&k1, testHash(&k1), ack, 1); !ok {
		t.Fatal("entry 1 missing")
	}
	// Entry 2's member answers: it is confirmed, established, and never evicted.
	k2 := testKey(2)
	if m, ok := tb.LookupReply(&k2, testHash(&k2), StateEstablished, 1); !ok || m != 1 {
		t.Fatalf("LookupReply = %d, %v", m, ok)
	}
	if _, s, _ := tb.Lookup(&k2, testHash(&k2), 1); s != StateEstablished || tb.Unconfirmed() != capacity-2 {
		t.Fatalf("after the reply: state %v, Unconfirmed %d", s, tb.Unconfirmed())
	}
	// SYNs evict 3, 4, 5, 6, 7, 1 (least recently seen first), then the half-open 0,
	// then the SYNs' own entries.
	var order []int
	for n := range capacity {
		k := testKey(100 + n)
		present := map[int]bool{}
		for i := range capacity {
			ki := testKey(i)
			_, _, present[i] = tb.Lookup(&ki, testHash(&ki), 2)
		}
		if ev, ok := tb.Insert(&k, testHash(&k), 2, StateSynRecv, 2); !ok || !ev {
			t.Fatalf("SYN %d into a full table: evicted %v, ok %v", n, ev, ok)
		}
		for i := range capacity {
			ki := testKey(i)
			if _, _, ok := tb.Lookup(&ki, testHash(&ki), 2); present[i] && !ok {
				order = append(order, i)
			}
		}
		mustCheck(t, tb, testHash)
	}
	if want := []int{3, 4, 5, 6, 7, 1, 0}; !slices.Equal(order, want) {
		t.Fatalf("evicted %v, want %v", order, want)
	}
	if _, s, ok := tb.Lookup(&k2, testHash(&k2), 2); !ok || s != StateEstablished {
		t.Fatalf("the confirmed entry: %v %v", s, ok)
	}
	if st := tb.Stats(); st.Evictions != capacity || st.EvictedUnconfirmed != 6 || st.Confirmed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestUnconfirmedTimeout checks that an unconfirmed entry lives its short timeout
// while only the client sends, and the timeout of its confirmed state once the member
// replies; a reply to a UDP flow confirms it as UDP.
func TestUnconfirmedTimeout(t *testing.T) {
	tb := newTable(t, 16)
	tcp, udp, quiet := testKey(1), testKey(2), testKey(3)
	for _, k := range []Key{tcp, udp, quiet} {
		insert(t, tb, k, 1, StateUnconfirmed, 100)
	}
	// The client keeps sending to tcp: each packet refreshes it for 10 s only.
	for now := uint32(101); now <= 130; now++ {
		if _, ok := tb.LookupTCP(&tcp, testHash(&tcp), ack, now); !ok {
			t.Fatalf("tcp lost at %d", now)
		}
		tb.Expire(now, 64)
	}
	if _, _, ok := tb.Lookup(&quiet, testHash(&quiet), 130); ok {
		t.Fatal("an unconfirmed entry outlived its 10 s")
	}
	if _, _, ok := tb.Lookup(&udp, testHash(&udp), 130); ok {
		t.Fatal("an unconfirmed UDP entry outlived its 10 s")
	}
	udp = testKey(4)
	insert(t, tb, udp, 1, StateUnconfirmed, 130)
	if _, ok := tb.LookupReply(&tcp, testHash(&tcp), StateEstablished, 130); !ok {
		t.Fatal("LookupReply missed tcp")
	}
	if _, ok := tb.LookupReply(&udp, testHash(&udp), StateUDP, 130); !ok {
		t.Fatal("LookupReply missed udp")
	}
	for _, tc := range []struct {
		k     Key
		state State
	}{{tcp, StateEstablished}, {udp, StateUDP}} {
		if _, s, ok := tb.Lookup(&tc.k, testHash(&tc.k), 400); !ok || s != tc.state {
			t.Fatalf("at 400: %v %v, want %v", s, ok, tc.state)
		}
	}
	// A reply refreshes a confirmed entry, but not a half-open one.
	if _, ok := tb.LookupReply(&udp, testHash(&udp), StateUDP, 420); !ok {
		t.Fatal("LookupReply missed udp")
	}
	if _, _, ok := tb.Lookup(&udp, testHash(&udp), 720); !ok {
		t.Fatal("a reply did not refresh the UDP entry")
	}
	syn := testKey(5)
	insert(t, tb, syn, 1, StateSynRecv, 700)
	if _, ok := tb.LookupReply(&syn, testHash(&syn), StateEstablished, 720); !ok {
		t.Fatal("LookupReply missed the half-open entry")
	}
	if _, _, ok := tb.Lookup(&syn, testHash(&syn), 731); ok {
		t.Fatal("a reply refreshed or confirmed a half-open entry")
	}
	absent := testKey(6)
	if _, ok := tb.LookupReply(&absent, testHash(&absent), StateEstablished, 731); ok {
		t.Fatal("LookupReply found an absent key")
	}
	mustCheck(t, tb, testHash)
}

func TestFullTableReclaimsExpired(t *testing.T) {
	tb := newTable(t, 50)
	for i := range 50 {
		insert(t, tb, testKey(i), 1, StateUDP, 0) // expire at 300
	}
	k := testKey(100)
	if _, ok := tb.Insert(&k, testHash(&k), 1, StateUDP, 300); ok {
		t.Fatal("insert into a full table of live UDP flows succeeded")
	}
	// The reaper has never run: Insert reclaims on its own.
	for i := range 20 {
		k := testKey(100 + i)
		if ev, ok := tb.Insert(&k, testHash(&k), 2, StateUDP, 301); !ok || ev {
			t.Fatalf("insert %d at 301: evicted %v ok %v", i, ev, ok)
		}
	}
	if tb.Len() > 50 || tb.MemberConns(2) != 20 || tb.Len() != 20+int(tb.MemberConns(1)) {
		t.Fatalf("Len %d, conns %d %d", tb.Len(), tb.MemberConns(1), tb.MemberConns(2))
	}
	mustCheck(t, tb, testHash)
}

func TestInsertInvalidState(t *testing.T) {
	tb := newTable(t, 4)
	k := testKey(1)
	for _, s := range []State{0, StateUnconfirmed + 1, 255} {
		if _, ok := tb.Insert(&k, testHash(&k), 1, s, 0); ok {
			t.Fatalf("Insert with state %v succeeded", s)
		}
	}
	if tb.Len() != 0 || tb.Stats().InsertFailures != 3 {
		t.Fatalf("Len %d stats %+v", tb.Len(), tb.Stats())
	}
}

// TestCollisions puts every key in one bucket and removes entries from the head,
// middle and tail of the chain, by Delete, by lookup of an expired entry, and by the
// reaper (which finds the bucket from the chain's end mark).
func TestCollisions(t *testing.T) {
	for _, tc := range []struct {
		name string
		hash func(*Key) uint64
	}{
		{"same tag", func(*Key) uint64 { return 5 }},
		{"mixed tags", func(k *Key) uint64 { return uint64(k.ClientPort)<<61 | 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) { testCollisions(t, tc.hash) })
	}
}

func testCollisions(t *testing.T, same func(*Key) uint64) {
	tb := newTable(t, 64)
	const n = 40
	for i := range n {
		k := testKey(i)
		st := StateEstablished
		if i%4 == 0 {
			st = StateClose // expires at 10+i
		}
		if _, ok := tb.Insert(&k, same(&k), uint16(i), st, uint32(i)); !ok {
			t.Fatal("insert failed")
		}
	}
	mustCheck(t, tb, same)
	for i := range n {
		k := testKey(i)
		if m, _, ok := tb.Lookup(&k, same(&k), 40); ok != (i%4 != 0 || uint32(i)+10 >= 40) || ok && m != uint16(i) {
			t.Fatalf("key %d: member %d ok %v", i, m, ok)
		}
		mustCheck(t, tb, same)
	}
	for _, i := range []int{39, 21, 1} { // head (newest), middle, tail
		k := testKey(i)
		if !tb.Delete(&k, same(&k)) {
			t.Fatalf("Delete %d failed", i)
		}
		mustCheck(t, tb, same)
	}
	tb.Expire(60, 1000) // reaps the remaining Close entries
	mustCheck(t, tb, same)
	for i := range n {
		k := testKey(i)
		_, _, ok := tb.Lookup(&k, same(&k), 60)
		if want := i%4 != 0 && i != 39 && i != 21 && i != 1; ok != want {
			t.Fatalf("key %d: ok %v, want %v", i, ok, want)
		}
	}
	if tb.Len() != 27 {
		t.Fatalf("Len %d, want 27", tb.Len())
	}
	// All gone after the established timeout, the last reaped from the tail.
	tb.Expire(60+900+1, 1<<20)
	if tb.Len() != 0 {
		t.Fatalf("Len %d after every timeout", tb.Len())
	}
	mustCheck(t, tb, same)
}

func TestMemberCounts(t *testing.T) {
	tb := newTable(t, 10)
	for i := range 10 {
		insert(t, tb, testKey(i), uint16(i%3)*1000, StateSynRecv, 0)
	}
	counts := tb.MemberCounts()
	if len(counts) != 1<<16 || counts[0] != 4 || counts[1000] != 3 || counts[2000] != 3 {
		t.Fatalf("counts: len %d [0]=%d [1000]=%d [2000]=%d", len(counts), counts[0], counts[1000], counts[2000])
	}
	k := testKey(0)
	tb.Delete(&k, testHash(&k)) // delete
	k = testKey(100)
	insert(t, tb, k, 65535, StateEstablished, 1) // takes the deleted entry
	k = testKey(101)
	if ev, ok := tb.Insert(&k, testHash(&k), 65535, StateEstablished, 1); !ev || !ok {
		t.Fatalf("insert into a full table: evicted %v ok %v", ev, ok) // evicts key 1
	}
	if counts[1000] != 2 {
		t.Fatalf("member 1000 has %d conns after eviction, want 2", counts[1000])
	}
	tb.Expire(40, 100) // expires the rest but keys 100 and 101
	for _, c := range []struct {
		id   uint16
		want uint32
	}{{0, 0}, {1000, 0}, {2000, 0}, {65535, 2}} {
		if got := tb.MemberConns(c.id); got != c.want || counts[c.id] != c.want {
			t.Errorf("member %d: %d conns (view %d), want %d", c.id, got, counts[c.id], c.want)
		}
	}
	mustCheck(t, tb, testHash)
}

func TestMemory(t *testing.T) {
	for _, capacity := range []int{1 << 20, 1_000_000, 3_000_000} {
		tb := newTable(t, capacity)
		per := float64(tb.MemoryBytes()) / float64(capacity)
		t.Logf("capacity %d: %d bytes, %.1f B/entry", capacity, tb.MemoryBytes(), per)
		if per > 64 {
			t.Errorf("capacity %d: %.1f bytes per entry, want ≤ 64", capacity, per)
		}
	}
	// 10M entries in ≤ 1 GiB, computed from the layout (BenchmarkMemory10M builds it).
	const tenM = 10_000_000
	bytes := (tenM+4+wheelSlots)*int(EntrySize()) + (1<<24)*4 + (1<<16)*4
	if bytes > 1<<30 {
		t.Errorf("10M entries take %d bytes", bytes)
	}
}

func TestClock(t *testing.T) {
	t0 := time.Now()
	a := Clock(t0)
	if b := Clock(t0.Add(90 * time.Second)); b-a != 90 {
		t.Fatalf("Clock advanced %d for 90 s", b-a)
	}
	if b := Clock(t0.Add(1500 * time.Millisecond)); b-a > 2 || b-a < 1 {
		t.Fatalf("Clock advanced %d for 1.5 s", b-a)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{
		StateSynRecv: "syn_recv", StateEstablished: "established", StateFin: "fin",
		StateClose: "close", StateUDP: "udp", StateUnconfirmed: "unconfirmed", 0: "state(0)",
	} {
		if s.String() != want {
			t.Errorf("%d: %q, want %q", s, s.String(), want)
		}
	}
}

func TestPrefetchBurstChangesNothing(t *testing.T) {
	tb, err := New(Config{Capacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	k := Key{ClientPort: 1}
	if _, ok := tb.Insert(&k, 12345, 7, StateEstablished, 100); !ok {
		t.Fatal("insert failed")
	}
	tb.PrefetchBurst([]uint64{0, 12345, 999, 12345})
	if m, st, ok := tb.Lookup(&k, 12345, 100); !ok || m != 7 || st != StateEstablished || tb.Len() != 1 {
		t.Fatalf("after PrefetchBurst: member %d state %v ok %v len %d", m, st, ok, tb.Len())
	}
	tb.PrefetchBurst(make([]uint64, 1000)) // more than 256: the rest is ignored
}

func TestSetTimeouts(t *testing.T) {
	tb, err := New(Config{Capacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.SetTimeouts(Timeouts{Established: config.Duration(5 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	k := Key{ClientPort: 9}
	tb.Insert(&k, 1, 1, StateEstablished, 1000)
	if _, _, ok := tb.Lookup(&k, 1, 1005); !ok {
		t.Fatal("expired before the new timeout")
	}
	if _, _, ok := tb.Lookup(&k, 1, 1007); ok {
		t.Fatal("alive after the new 5 s timeout")
	}
	if err := tb.SetTimeouts(Timeouts{UDP: config.Duration(-time.Second)}); err == nil {
		t.Fatal("negative timeout accepted")
	}
	if tb.timeouts[StateEstablished] != 5 {
		t.Fatal("a refused SetTimeouts changed the timeouts")
	}
}

func TestTimeoutsCheck(t *testing.T) {
	if err := (Timeouts{Established: config.Duration(time.Hour)}).Check(); err != nil {
		t.Fatal(err)
	}
	for _, to := range []Timeouts{{UDP: config.Duration(-time.Second)}, {Fin: config.Duration(MaxTimeout + time.Hour)}} {
		if err := to.Check(); err == nil {
			t.Errorf("%+v: no error", to)
		}
	}
}
