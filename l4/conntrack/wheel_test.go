package conntrack

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/config"
)

// TestReapedOnTime runs a table with timeouts longer than the wheel (entries take
// several laps) and shorter, refreshing flows at random, and checks after every second
// that Expire has reclaimed exactly the entries whose time has passed.
func TestReapedOnTime(t *testing.T) {
	tb, err := New(Config{Capacity: 3000, Timeouts: Timeouts{
		Established: config.Duration(2500 * time.Second), UDP: config.Duration(700 * time.Second), SynRecv: config.Duration(3 * time.Second),
	}})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	expiry := map[int]uint32{} // key → expiry, for keys in the table
	next := 0
	states := []State{StateEstablished, StateUDP, StateSynRecv}
	for now := uint32(1); now < 9000; now++ {
		for range r.IntN(3) {
			if tb.Len() == tb.Cap() {
				break
			}
			k := testKey(next)
			st := states[next%3]
			insert(t, tb, k, 1, st, now)
			expiry[next] = now + tb.timeouts[st]
			next++
		}
		for range 5 {
			if next == 0 {
				break
			}
			i := r.IntN(next)
			if exp, ok := expiry[i]; ok && !expired(now, exp) {
				k := testKey(i)
				if _, ok := tb.LookupUDP(&k, testHash(&k), now); !ok {
					t.Fatalf("at %d: key %d missing, expires %d", now, i, exp)
				}
				_, st, _ := tb.Lookup(&k, testHash(&k), now)
				expiry[i] = now + tb.timeouts[st]
			}
		}
		n := tb.Expire(now, 1<<20)
		freed := 0
		for i, exp := range expiry {
			k := testKey(i)
			found, _, _ := tb.find(&k, testHash(&k))
			if expired(now, exp) {
				if found != 0 {
					t.Fatalf("at %d: key %d expired at %d but is still in the table", now, i, exp)
				}
				delete(expiry, i)
				freed++
			} else if found == 0 {
				t.Fatalf("at %d: key %d (expiry %d) was reclaimed early", now, i, exp)
			}
		}
		if n != freed {
			t.Fatalf("at %d: Expire returned %d, %d entries expired", now, n, freed)
		}
		if now%500 == 0 {
			mustCheck(t, tb, testHash)
		}
	}
	if tb.Stats().Expired < 1000 {
		t.Fatalf("only %d expiries: the test did not exercise the reaper", tb.Stats().Expired)
	}
}

// TestReaperCatchUp leaves the reaper idle for a long time: it then needs few calls,
// not one per elapsed second, to reclaim everything.
func TestReaperCatchUp(t *testing.T) {
	tb := newTable(t, 1000)
	for i := range 1000 {
		insert(t, tb, testKey(i), 1, StateUDP, uint32(i/100))
	}
	now := uint32(1_000_000)
	calls := 0
	for tb.Len() > 0 {
		if calls++; calls > 100 {
			t.Fatalf("%d entries left after 100 calls", tb.Len())
		}
		if n := tb.Expire(now, 64); n > 64 {
			t.Fatalf("Expire(max 64) reclaimed %d", n)
		}
	}
	t.Logf("%d calls", calls)
	// The cursor jumped to now: the next call has nothing to do.
	if tb.cursor != now {
		t.Fatalf("cursor %d, want %d", tb.cursor, now)
	}
	mustCheck(t, tb, testHash)
	// And a new entry is reaped on time.
	insert(t, tb, testKey(1), 1, StateClose, now)
	tb.Expire(now+10, 64)
	if tb.Len() != 1 {
		t.Fatal("reaped before its time")
	}
	tb.Expire(now+11, 64)
	if tb.Len() != 0 {
		t.Fatal("not reaped on time")
	}
}

func TestExpireBudget(t *testing.T) {
	tb := newTable(t, 500)
	for i := range 500 {
		insert(t, tb, testKey(i), 1, StateClose, 0)
	}
	for _, max := range []int{0, -1} {
		if n := tb.Expire(100, max); n != 0 {
			t.Fatalf("Expire(max %d) = %d", max, n)
		}
	}
	total := 0
	for tb.Len() > 0 {
		n := tb.Expire(100, 7)
		if n > 7 {
			t.Fatalf("Expire(max 7) reclaimed %d", n)
		}
		total += n
	}
	if total != 500 {
		t.Fatalf("reclaimed %d in all", total)
	}
}

func TestPrefetchChangesNothing(t *testing.T) {
	tb := newTable(t, 64)
	for i := range 64 {
		insert(t, tb, testKey(i), uint16(i), StateEstablished, 0)
	}
	for i := range 64 {
		k := testKey(i)
		tb.Prefetch(testHash(&k))
		tb.Prefetch(uint64(i) << 58)
	}
	for i := range 64 {
		k := testKey(i)
		if m, s, ok := tb.Lookup(&k, testHash(&k), 0); !ok || m != uint16(i) || s != StateEstablished {
			t.Fatal("Prefetch changed the table")
		}
	}
	mustCheck(t, tb, testHash)
}
