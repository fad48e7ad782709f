package overload

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1, math.Abs(b)) }

func TestBucketRateAndBurst(t *testing.T) {
	var b Bucket
	if b.Allow(0) {
		t.Fatal("a zero bucket gave a token")
	}
	b.Set(100, 10) // a token every 10 ms, 10 saved up
	now := int64(0)
	n := 0
	for b.Allow(now) {
		n++
	}
	if n != 10 {
		t.Fatalf("a full bucket gave %d tokens, want its burst of 10", n)
	}
	// One second later: 10 again (the burst caps what was saved), not 100.
	now += int64(time.Second)
	n = 0
	for b.Allow(now) {
		n++
	}
	if n != 10 {
		t.Fatalf("after a quiet second the bucket gave %d tokens, want 10", n)
	}
	// Over a second of steady asking (every millisecond), about 100 pass.
	n = 0
	for range 1000 {
		now += int64(time.Millisecond)
		if b.Allow(now) {
			n++
		}
	}
	if n < 99 || n > 101 {
		t.Fatalf("a second at 100/s gave %d tokens", n)
	}
}

func TestBucketSetKeepsCredit(t *testing.T) {
	var b Bucket
	b.Set(10, 10)
	for b.Allow(0) {
	}
	// A new rate (quotas are recomputed every interval) neither refills an empty
	// bucket nor resets a full one.
	b.Set(20, 10)
	if b.Allow(0) {
		t.Fatal("changing the rate refilled an empty bucket")
	}
	if !b.Allow(int64(50 * time.Millisecond)) {
		t.Fatal("no token 50 ms later at 20/s")
	}
	b.Set(0, 10)
	if b.Allow(int64(time.Hour)) {
		t.Fatal("a bucket with rate 0 gave a token")
	}
	b.Set(5, 2)
	n := 0
	for b.Allow(int64(time.Hour)) {
		n++
	}
	if n != 2 {
		t.Fatalf("a bucket given a rate again gave %d tokens, want it full with its burst of 2", n)
	}
}

func TestWatermarksHysteresis(t *testing.T) {
	w := Watermarks{High: 0.7, Low: 0.5, Hold: 2 * time.Second}
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	steps := []struct {
		s       float64
		load    float64
		prot    bool
		changed bool
	}{
		{0, 0.3, false, false},
		{1, 0.69, false, false},
		{2, 0.7, true, true},  // at the high watermark: protecting
		{3, 0.6, true, false}, // between the watermarks: stays
		{4, 0.4, true, false}, // below low: the hold starts
		{5, 0.55, true, false},
		{6, 0.4, true, false}, // below again: the hold starts over
		{7.5, 0.3, true, false},
		{8, 0.2, false, true}, // 2 s below low
		{9, 0.6, false, false},
		{10, 0.95, true, true},
	}
	for _, st := range steps {
		p, c := w.Update(st.load, at(st.s))
		if p != st.prot || c != st.changed {
			t.Fatalf("t=%vs load %v: protecting %v changed %v, want %v %v", st.s, st.load, p, c, st.prot, st.changed)
		}
	}
	if _, since := w.Protecting(); !since.Equal(at(10)) {
		t.Fatalf("since %v, want %v", since, at(10))
	}
}

func TestSplitSurgeDoesNotStarveOthers(t *testing.T) {
	// Rule 0 surges to 1000/s, rule 1 asks 50/s, rule 2 asks 200/s; budget 600 by
	// equal weights: guarantee 200 each. Rule 1 is satisfied and leaves 150, rule
	// 2 fits the level of 275 (600-50 over 2 weights); rule 0 gets the rest: 350.
	q := Split(600, []float64{1, 1, 1}, []float64{1000, 50, 200}, 0)
	if !near(q[0], 350) {
		t.Fatalf("surging rule quota %v, want 350 (%v)", q[0], q)
	}
	if q[1] < 50 || q[2] < 200 {
		t.Fatalf("a rule under its share is throttled: %v", q)
	}
	if q[1] < 200 || q[2] < 200 {
		t.Fatalf("a rule under its share lost its guarantee of 200: %v", q)
	}
}

func TestSplitWeights(t *testing.T) {
	// Both demand more than the budget: split 3:1.
	q := Split(400, []float64{3, 1}, []float64{1000, 1000}, 0)
	if !near(q[0], 300) || !near(q[1], 100) {
		t.Fatalf("quotas %v, want 300 100", q)
	}
	// The light one (weight 3) uses 60 of its 300; the heavy one gets 340.
	q = Split(400, []float64{3, 1}, []float64{60, 1000}, 0)
	if !near(q[1], 340) || q[0] < 60 {
		t.Fatalf("quotas %v, want the heavy rule at 340 and the light one ≥ 60", q)
	}
	// Floor, and weight 0.
	q = Split(10, []float64{1, 0}, []float64{1000, 1000}, 5)
	if !near(q[0], 10) || !near(q[1], 5) {
		t.Fatalf("quotas %v, want 10 and the floor 5", q)
	}
	// Every weight 0: equal.
	q = Split(10, []float64{0, 0}, []float64{100, 100}, 0)
	if !near(q[0], 5) || !near(q[1], 5) {
		t.Fatalf("quotas %v, want 5 5", q)
	}
	if len(Split(10, nil, nil, 0)) != 0 {
		t.Fatal("no rules, some quotas")
	}
}

func TestControllerThrottlesTheSurgeAndLifts(t *testing.T) {
	c := NewController(Params{High: 0.7, Low: 0.5, Hold: 2 * time.Second, Floor: 1})
	now := time.Unix(2000, 0)
	step := func(load float64, rules []Rule) Result {
		now = now.Add(time.Second)
		return c.Step(now, load, rules)
	}
	calm := []Rule{{ID: 1, Weight: 1, Demand: 100, Admitted: 100}, {ID: 2, Weight: 1, Demand: 50, Admitted: 50}}
	if r := step(0.3, calm); r.Protecting || r.Quotas != nil {
		t.Fatalf("protecting at 30%%: %+v", r)
	}
	// Rule 1 surges to 2000/s: the load (say, 1.0 with capacity for 2100 × 0.7)
	// passes the watermark.
	surge := []Rule{{ID: 1, Weight: 1, Demand: 2000, Admitted: 2000}, {ID: 2, Weight: 1, Demand: 50, Admitted: 50}}
	r := step(1.0, surge)
	if !r.Protecting || !r.Changed {
		t.Fatalf("not protecting at 100%%: %+v", r)
	}
	// Budget = 2050 × 0.6 / 1.0 = 1230: rule 2 keeps its 50 and more, rule 1 gets
	// the rest.
	if !near(r.Budget, 1230) {
		t.Fatalf("budget %v, want 1230", r.Budget)
	}
	if r.Quotas[1] < 50 || !near(r.Quotas[0], 1180) {
		t.Fatalf("quotas %v, want rule 1 at 1180 and rule 2 ≥ 50", r.Quotas)
	}
	// Still too much (0.9): the budget shrinks by 0.6/0.9.
	r = step(0.9, []Rule{{ID: 1, Weight: 1, Demand: 2000, Admitted: 1180}, {ID: 2, Weight: 1, Demand: 50, Admitted: 50}})
	if !near(r.Budget, 820) || r.Quotas[1] < 50 {
		t.Fatalf("budget %v quotas %v, want 820 with rule 2 ≥ 50", r.Budget, r.Quotas)
	}
	// A load that would halve it more than twice over is cut to a halving.
	r = step(5, []Rule{{ID: 1, Weight: 1, Demand: 2000, Admitted: 770}, {ID: 2, Weight: 1, Demand: 50, Admitted: 50}})
	if !near(r.Budget, 410) {
		t.Fatalf("budget %v, want 410 (halved at most)", r.Budget)
	}
	// The surge ends: below low for the hold time lifts the quotas.
	for i := range 2 {
		if r = step(0.2, calm); !r.Protecting {
			t.Fatalf("lifted after %d s below low, hold is 2 s", i+1)
		}
		if r.Budget > 2*150 {
			t.Fatalf("budget %v above twice the demand", r.Budget)
		}
	}
	if r = step(0.2, calm); r.Protecting || !r.Changed || r.Quotas != nil {
		t.Fatalf("not lifted after the hold: %+v", r)
	}
}

func TestControllerByShare(t *testing.T) {
	c := NewController(Params{High: 0.7, Low: 0.5, Hold: time.Second, ByShare: true, ShareWindow: 10 * time.Second})
	now := time.Unix(3000, 0)
	// While normal, rule 1 takes 300/s and rule 2 100/s: shares 3:1.
	for range 30 {
		now = now.Add(time.Second)
		c.Step(now, 0.3, []Rule{{ID: 1, Demand: 300, Admitted: 300}, {ID: 2, Demand: 100, Admitted: 100}})
	}
	if s1, s2 := c.Share(1), c.Share(2); !near(s1/s2, 3) {
		t.Fatalf("shares %v %v, want 3:1", s1, s2)
	}
	// Both surge: the budget (400 × 0.6 / 1.2 = 200, target over load) is split 3:1
	// by their shares, though their weights are equal.
	now = now.Add(time.Second)
	r := c.Step(now, 1.2, []Rule{{ID: 1, Weight: 1, Demand: 5000, Admitted: 200}, {ID: 2, Weight: 1, Demand: 5000, Admitted: 200}})
	if !r.Protecting || !near(r.Quotas[0], 150) || !near(r.Quotas[1], 50) {
		t.Fatalf("quotas %v (budget %v), want 150 50", r.Quotas, r.Budget)
	}
}

func TestLoadMax(t *testing.T) {
	if m := (Load{Busy: 0.2, Table: 0.9, PPS: 0.5}).Max(); m != 0.9 {
		t.Fatalf("max %v", m)
	}
}

// TestControllerKeepsLightRulesRate: when the load does not answer the quotas (the
// budget halves at every step), a rule that did not surge keeps Keep times its
// average rate from before protection.
func TestControllerKeepsLightRulesRate(t *testing.T) {
	c := NewController(Params{High: 0.7, Low: 0.5, Hold: time.Second, ShareWindow: 5 * time.Second, Keep: 1.5, Floor: 1})
	now := time.Unix(4000, 0)
	for range 60 {
		now = now.Add(time.Second)
		c.Step(now, 0.2, []Rule{{ID: 1, Weight: 1, Demand: 1, Admitted: 1}, {ID: 2, Weight: 1, Demand: 40, Admitted: 40}})
	}
	// The load stays at 3 whatever is admitted; each rule is admitted what its quota
	// lets through.
	r := Result{Quotas: []float64{5000, 40}}
	for range 20 {
		now = now.Add(time.Second)
		r = c.Step(now, 3, []Rule{{ID: 1, Weight: 1, Demand: 5000, Admitted: min(5000, r.Quotas[0])},
			{ID: 2, Weight: 1, Demand: 40, Admitted: min(40, r.Quotas[1])}})
	}
	if !r.Protecting || r.Budget > 40 {
		t.Fatalf("budget %v after 20 steps at 3 times the capacity, want it below the light rule's 40/s", r.Budget)
	}
	if r.Quotas[1] < 59 {
		t.Fatalf("the light rule's quota fell to %v, want at least 1.5 × its 40/s", r.Quotas[1])
	}
	if r.Quotas[0] > 40 {
		t.Fatalf("the surging rule's quota %v, want it held near the budget", r.Quotas[0])
	}
}

// TestControllerHoldsWhileTheSurgeLasts: quotas that bring the load below the low
// watermark are not lifted while the rules still ask for more than they are admitted;
// they are once the surge is over.
func TestControllerHoldsWhileTheSurgeLasts(t *testing.T) {
	c := NewController(Params{High: 0.7, Low: 0.5, Hold: time.Second, Floor: 1})
	now := time.Unix(5000, 0)
	step := func(load float64, demand, admitted float64) Result {
		now = now.Add(500 * time.Millisecond)
		return c.Step(now, load, []Rule{{ID: 1, Weight: 1, Demand: demand, Admitted: admitted}})
	}
	if r := step(2, 1000, 1000); !r.Protecting {
		t.Fatal("not protecting at 200%")
	}
	// Held to 0.3 by the quotas, with ten times the admitted rate asked for.
	for i := range 10 {
		if r := step(0.3, 1000, 100); !r.Protecting {
			t.Fatalf("lifted after %d steps while the surge goes on", i+1)
		}
	}
	// Over: asked = admitted, load 0.3 for the hold.
	var r Result
	for range 4 {
		r = step(0.3, 100, 100)
	}
	if r.Protecting {
		t.Fatal("not lifted after the surge ended")
	}
}
