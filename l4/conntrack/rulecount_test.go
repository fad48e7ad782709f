package conntrack

import "testing"

// TestRuleConns: the per-rule count follows inserts, deletes, expiry and eviction.
func TestRuleConns(t *testing.T) {
	tb := newTable(t, 4)
	key := func(i int, rule uint16) (Key, uint64) {
		k := Key{ClientPort: uint16(1000 + i), Rule: rule}
		k.Client[15] = byte(i)
		return k, uint64(i)*0x9e3779b97f4a7c15 | 1
	}
	for i := range 3 {
		k, h := key(i, 7)
		tb.Insert(&k, h, 1, StateSynRecv, 100)
	}
	k, h := key(3, 8)
	tb.Insert(&k, h, 1, StateEstablished, 100)
	if tb.RuleConns(7) != 3 || tb.RuleConns(8) != 1 {
		t.Fatalf("rule counts %d %d, want 3 1", tb.RuleConns(7), tb.RuleConns(8))
	}
	k, h = key(0, 7)
	if !tb.Delete(&k, h) || tb.RuleConns(7) != 2 {
		t.Fatalf("after a delete rule 7 counts %d, want 2", tb.RuleConns(7))
	}
	// Full: a new entry of rule 8 evicts the oldest half-open one (rule 7).
	k, h = key(4, 8)
	tb.Insert(&k, h, 1, StateSynRecv, 101)
	k, h = key(5, 8)
	if _, ok := tb.Insert(&k, h, 1, StateSynRecv, 101); !ok {
		t.Fatal("insert into a full table with half-open entries failed")
	}
	if tb.RuleConns(7) != 1 || tb.RuleConns(8) != 3 {
		t.Fatalf("after an eviction rule counts %d %d, want 1 3", tb.RuleConns(7), tb.RuleConns(8))
	}
	// Everything expires.
	for range 10 {
		tb.Expire(100000, 64)
	}
	if tb.RuleConns(7) != 0 || tb.RuleConns(8) != 0 || tb.Len() != 0 {
		t.Fatalf("after expiry rule counts %d %d, len %d", tb.RuleConns(7), tb.RuleConns(8), tb.Len())
	}
}
