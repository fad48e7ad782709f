package conntrack

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// model is a map-based reference connection table with the documented semantics.
type model struct {
	m        map[Key]*modelEntry
	timeouts [numStates]uint32
	cap      int
	seq      uint64 // orders half-open entries by their last packet
}

type modelEntry struct {
	member uint16
	state  State
	expire uint32
	seq    uint64
}

func newModel(capacity int, timeouts [numStates]uint32) *model {
	return &model{m: map[Key]*modelEntry{}, timeouts: timeouts, cap: capacity}
}

func (m *model) alive(e *modelEntry, now uint32) bool { return int32(now-e.expire) <= 0 }

// get returns k's live entry; an expired one is dropped, as the table reclaims it.
func (m *model) get(k Key, now uint32) *modelEntry {
	e := m.m[k]
	if e != nil && !m.alive(e, now) {
		delete(m.m, k)
		return nil
	}
	return e
}

func (m *model) set(e *modelEntry, s State, now uint32) {
	e.state = s
	e.expire = now + m.timeouts[s]
	m.seq++
	e.seq = m.seq
}

// tcp applies the IPVS-style transition table, written out independently of nextState.
func modelTCP(s State, flags uint8) State {
	if s == StateUDP {
		return s
	}
	if flags&rst != 0 {
		return StateClose
	}
	if flags&syn != 0 {
		return map[State]State{StateSynRecv: StateSynRecv, StateEstablished: StateEstablished,
			StateFin: StateSynRecv, StateClose: StateSynRecv, StateUnconfirmed: StateSynRecv}[s]
	}
	if flags&fin != 0 {
		return map[State]State{StateSynRecv: StateFin, StateEstablished: StateFin,
			StateFin: StateFin, StateClose: StateClose, StateUnconfirmed: StateUnconfirmed}[s]
	}
	if flags&ack != 0 && s == StateSynRecv {
		return StateEstablished
	}
	return s
}

// victim returns the live key an insert into a full table evicts: the unconfirmed one
// least recently seen, else the half-open one least recently seen.
func (m *model) victim(now uint32) (Key, bool) {
	for _, st := range []State{StateUnconfirmed, StateSynRecv} {
		var best Key
		var bestSeq uint64
		found := false
		for k, e := range m.m {
			if e.state == st && m.alive(e, now) && (!found || e.seq < bestSeq) {
				best, bestSeq, found = k, e.seq, true
			}
		}
		if found {
			return best, true
		}
	}
	return Key{}, false
}

func (m *model) counts(now uint32) (alive, total, halfAlive, halfTotal int, perMember map[uint16][2]int, unconf [2]int) {
	perMember = map[uint16][2]int{}
	for _, e := range m.m {
		c := perMember[e.member]
		total++
		c[1]++
		if e.state == StateSynRecv {
			halfTotal++
		}
		if e.state == StateUnconfirmed {
			unconf[1]++
		}
		if m.alive(e, now) {
			alive++
			c[0]++
			if e.state == StateSynRecv {
				halfAlive++
			}
			if e.state == StateUnconfirmed {
				unconf[0]++
			}
		}
		perMember[e.member] = c
	}
	return
}

// runModel drives a table and the model with ops from next and compares them.
// next returns values in [0, n); it reports false when the ops run out.
func runModel(t testing.TB, next func(n int) (int, bool), hashFn func(*Key) uint64) {
	capacity := 1
	if v, ok := next(200); ok {
		capacity += v
	}
	timeouts := Timeouts{SynRecv: config.Duration(5 * time.Second), Established: config.Duration(40 * time.Second),
		Fin: config.Duration(8 * time.Second), Close: config.Duration(3 * time.Second),
		UDP: config.Duration(1500 * time.Second), Unconfirmed: config.Duration(4 * time.Second)}
	tb, err := New(Config{Capacity: capacity, Timeouts: timeouts})
	if err != nil {
		t.Fatal(err)
	}
	md := newModel(capacity, tb.timeouts)
	keys := 2*capacity + 10
	now := uint32(0xffff_ff00) // the clock wraps during the run
	flagSet := []uint8{syn, ack, psh | ack, fin | ack, rst, rst | ack, 0, syn | ack, fin}
	states := []State{StateSynRecv, StateEstablished, StateUDP, StateFin, StateClose, StateUnconfirmed, StateUnconfirmed}

	for step := 0; ; step++ {
		op, ok := next(100)
		if !ok {
			break
		}
		kv, _ := next(keys)
		k := testKey(kv)
		h := hashFn(&k)
		switch {
		case op < 5: // time passes
			d, _ := next(8)
			if op == 0 {
				d *= 200
			}
			now += uint32(d)
		case op < 15:
			n, _ := next(64)
			tb.Expire(now, n)
		case op < 20:
			del := tb.Delete(&k, h)
			e := md.m[k]
			if e != nil && md.alive(e, now) && !del {
				t.Fatalf("step %d: Delete of a live entry = false", step)
			}
			if e == nil && del {
				t.Fatalf("step %d: Delete of an absent key = true", step)
			}
			delete(md.m, k)
		case op < 35:
			m, s, ok := tb.Lookup(&k, h, now)
			e := md.get(k, now)
			if ok != (e != nil) || ok && (m != e.member || s != e.state) {
				t.Fatalf("step %d: Lookup = %d %v %v, model %+v", step, m, s, ok, e)
			}
		case op < 40: // a reply from the member
			confirmed := StateEstablished
			if kv%2 == 1 {
				confirmed = StateUDP
			}
			m, ok := tb.LookupReply(&k, h, confirmed, now)
			e := md.get(k, now)
			if ok != (e != nil) || ok && m != e.member {
				t.Fatalf("step %d: LookupReply = %d %v, model %+v", step, m, ok, e)
			}
			switch {
			case e == nil || e.state == StateSynRecv:
			case e.state == StateUnconfirmed:
				md.set(e, confirmed, now)
			default:
				md.set(e, e.state, now)
			}
		case op < 45:
			m, ok := tb.LookupUDP(&k, h, now)
			e := md.get(k, now)
			if ok != (e != nil) || ok && m != e.member {
				t.Fatalf("step %d: LookupUDP = %d %v, model %+v", step, m, ok, e)
			}
			if e != nil {
				md.set(e, e.state, now)
			}
		default: // a packet: TCP lookup, and insert on a miss
			fi, _ := next(len(flagSet))
			flags := flagSet[fi]
			m, ok := tb.LookupTCP(&k, h, flags, now)
			e := md.get(k, now)
			if ok != (e != nil) || ok && m != e.member {
				t.Fatalf("step %d: LookupTCP = %d %v, model %+v", step, m, ok, e)
			}
			if e != nil {
				md.set(e, modelTCP(e.state, flags), now)
				break
			}
			si, _ := next(len(states))
			member, _ := next(5)
			st := states[si]
			victim, haveVictim := md.victim(now)
			ev, ok := tb.Insert(&k, h, uint16(member), st, now)
			switch {
			case !ok:
				if haveVictim {
					t.Fatalf("step %d: Insert failed with an unconfirmed or half-open entry to evict", step)
				}
			case ev:
				if !haveVictim {
					t.Fatalf("step %d: Insert evicted with no unconfirmed or half-open entry", step)
				}
				if _, _, found := tb.Lookup(&victim, hashFn(&victim), now); found {
					t.Fatalf("step %d: Insert evicted, but not the oldest unconfirmed (else half-open) entry", step)
				}
				delete(md.m, victim)
			}
			if ok {
				ne := &modelEntry{member: uint16(member)}
				md.set(ne, st, now)
				md.m[k] = ne
			}
		}

		alive, total, halfAlive, halfTotal, per, unconf := md.counts(now)
		if tb.Len() < alive || tb.Len() > total || tb.Len() > capacity {
			t.Fatalf("step %d: Len %d, model %d alive of %d, cap %d", step, tb.Len(), alive, total, capacity)
		}
		if tb.HalfOpen() < halfAlive || tb.HalfOpen() > halfTotal {
			t.Fatalf("step %d: HalfOpen %d, model %d alive of %d", step, tb.HalfOpen(), halfAlive, halfTotal)
		}
		if tb.Unconfirmed() < unconf[0] || tb.Unconfirmed() > unconf[1] {
			t.Fatalf("step %d: Unconfirmed %d, model %d alive of %d", step, tb.Unconfirmed(), unconf[0], unconf[1])
		}
		for id := range uint16(5) {
			if c := int(tb.MemberConns(id)); c < per[id][0] || c > per[id][1] {
				t.Fatalf("step %d: member %d has %d, model %v", step, id, c, per[id])
			}
		}
		if step%97 == 0 {
			if err := tb.check(hashFn); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	if err := tb.check(hashFn); err != nil {
		t.Fatal(err)
	}
	// An unbounded reap leaves exactly the live entries.
	tb.Expire(now, 1<<30)
	alive, _, _, _, _, _ := md.counts(now)
	if tb.Len() != alive {
		t.Fatalf("after a full reap: Len %d, model %d alive", tb.Len(), alive)
	}
	if err := tb.check(hashFn); err != nil {
		t.Fatal(err)
	}
}

func TestAgainstModel(t *testing.T) {
	hashes := []func(*Key) uint64{
		testHash,
		func(k *Key) uint64 { return uint64(k.ClientPort % 4) },                          // long chains, one tag
		func(k *Key) uint64 { return uint64(k.ClientPort%4) | uint64(k.ClientPort)<<61 }, // long chains, tags differ
	}
	for seed := range uint64(40) {
		hashFn := hashes[0]
		if seed%4 == 3 {
			hashFn = hashes[1+seed/4%2]
		}
		r := rand.New(rand.NewPCG(seed, seed*7+1))
		steps := 20_000
		if testing.Short() {
			steps = 3000
		}
		i := 0
		runModel(t, func(n int) (int, bool) {
			i++
			if i > steps {
				return 0, false
			}
			return r.IntN(n), true
		}, hashFn)
	}
}

func FuzzTable(f *testing.F) {
	f.Add([]byte{10, 50, 60, 70, 80, 90, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 200, 1})
	f.Add([]byte{0, 99, 1, 1, 1, 1, 99, 1, 1, 1, 1, 99, 2, 0, 0, 0})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, ops []byte) {
		i := 0
		runModel(t, func(n int) (int, bool) {
			if i+2 > len(ops) {
				return 0, false
			}
			v := int(ops[i])<<8 | int(ops[i+1])
			i += 2
			return v % n, true
		}, testHash)
	})
}
