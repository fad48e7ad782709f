// Package overload is the L4 load distributor's overload protection, as Qiniu's and
// Tencent's CLB write-ups describe it: the LD watches its own load, and past a high
// watermark it gives each rule a quota of new connections per second (and, when
// configured, of packets per second), enforced by token buckets, so that one VIP's
// surge cannot starve the others; below a low watermark it lifts the quotas.
//
// The package holds the parts that are not packets: the token bucket the datapath's
// workers enforce quotas and static limits with (Bucket), the load as the largest of
// its shares (Load), the watermarks with their hysteresis (Watermarks), the split of a
// budget between rules (Split) and the controller that ties them together each
// interval (Controller). l4/datapath measures, publishes and enforces; nothing here
// takes a lock or allocates per packet.
package overload

import (
	"math"
	"slices"
	"time"
)

// Bucket is a token bucket on a nanosecond clock: a token every 1/rate seconds, at
// most burst of them saved up. It is owned by one goroutine (a worker) and takes no
// lock. The zero value has no rate and never has a token; Set gives it one.
type Bucket struct {
	rate     float64
	burst    int
	interval int64 // nanoseconds per token; 0: never a token
	depth    int64 // interval * burst
	avail    int64 // nanoseconds of credit
	last     int64
}

// Set configures the bucket for rate tokens per second and bursts of burst (at least
// 1). A bucket given a rate for the first time, or after having none, starts full; a
// change of rate keeps the credit it has, cut to the new depth, so that quotas
// recomputed every interval neither reset nor refill a bucket. The same settings
// again change nothing. A rate ≤ 0 means no token at all.
func (b *Bucket) Set(rate float64, burst int) {
	if rate == b.rate && burst == b.burst {
		return
	}
	burst = max(burst, 1)
	had := b.interval != 0
	var frac float64
	if had && b.depth > 0 {
		frac = float64(b.avail) / float64(b.depth)
	}
	b.rate, b.burst = rate, burst
	if rate <= 0 || math.IsNaN(rate) {
		b.interval, b.depth, b.avail = 0, 0, 0
		return
	}
	b.interval = max(1, int64(float64(time.Second)/rate))
	b.depth = int64(burst) * b.interval
	if had {
		b.avail = min(b.depth, int64(frac*float64(b.depth)))
	} else {
		b.avail = b.depth
	}
}

// Rate returns the rate Set gave, in tokens per second.
func (b *Bucket) Rate() float64 { return b.rate }

// Ready reports whether a token is there at now (refilling first); Take spends it.
func (b *Bucket) Ready(now int64) bool {
	if b.interval == 0 {
		return false
	}
	if d := now - b.last; d > 0 {
		b.avail = min(b.depth, b.avail+d)
		b.last = now
	}
	return b.avail >= b.interval
}

// Take spends a token; call it after Ready reported one.
func (b *Bucket) Take() { b.avail -= b.interval }

// Allow is Ready then Take: it reports whether a token was there, and spends it.
func (b *Bucket) Allow(now int64) bool {
	if !b.Ready(now) {
		return false
	}
	b.Take()
	return true
}

// Load is the LD's load as shares of what it can carry, each 0 for none and 1 for
// all of it. Max is the load the watermarks compare.
type Load struct {
	// Busy is the busiest worker's share of time spent on work (a poll that found
	// packets, a sweep, a sync step) rather than polling empty queues.
	Busy float64
	// Table is the fullest worker's connection-table fill: entries over capacity.
	Table float64
	// PPS is the packets forwarded per second over the configured capacity.
	PPS float64
}

// Max returns the largest share, which is the load.
func (l Load) Max() float64 { return max(l.Busy, l.Table, l.PPS) }

// Watermarks is the state machine of protection: it enters "protecting" as soon as
// the load reaches High, and lifts it once the load has stayed below Low for Hold
// (so a load that hovers at a watermark does not make quotas come and go). Its zero
// value, with High, Low and Hold set, starts normal.
type Watermarks struct {
	High, Low float64
	Hold      time.Duration

	protecting bool
	since      time.Time // when the state last changed
	below      time.Time // since when the load has been below Low while protecting; zero: not below
}

// Update takes a load measured at now and returns whether the LD is protecting, and
// whether that just changed.
func (w *Watermarks) Update(load float64, now time.Time) (protecting, changed bool) {
	switch {
	case !w.protecting && load >= w.High:
		w.protecting, w.since, w.below = true, now, time.Time{}
		return true, true
	case w.protecting && load >= w.Low:
		w.below = time.Time{}
	case w.protecting:
		if w.below.IsZero() {
			w.below = now
		}
		if now.Sub(w.below) >= w.Hold {
			w.protecting, w.since, w.below = false, now, time.Time{}
			return false, true
		}
	}
	return w.protecting, false
}

// Protecting reports the state, and since when it has held.
func (w *Watermarks) Protecting() (bool, time.Time) { return w.protecting, w.since }

// Split divides a budget (per second) between rules: weighted max-min fairness
// (water-filling). Each rule is guaranteed budget × its weight's share; what a rule
// demanding less leaves unused goes to the rules that demand more, by weight, until
// none is left. So a rule's surge takes only what the others leave, never what they
// use. Every rule's quota is then the water level (what each unit of weight of the
// rules held back gets) times its weight: a rule under its share is not throttled and
// may grow up to that, which is at least its guarantee; if it does, the next
// interval's budget accounts for it. Quotas are at least floor. A weight ≤ 0 counts as
// 0, and such a rule gets the floor (when every weight is 0, all count as 1).
func Split(budget float64, weights, demands []float64, floor float64) []float64 {
	n := len(weights)
	q := make([]float64, n)
	if n == 0 {
		return q
	}
	w := make([]float64, n)
	var sum float64
	for i, x := range weights {
		if x > 0 && !math.IsInf(x, 0) {
			w[i] = x
			sum += x
		}
	}
	if sum == 0 {
		for i := range w {
			w[i] = 1
		}
		sum = float64(n)
	}
	budget = max(budget, 0)
	// Water-filling: rules whose demand fits under the level are satisfied and leave
	// the rest to the others, in order of demand per weight.
	order := make([]int, 0, n)
	for i := range n {
		order = append(order, i)
	}
	dw := func(i int) float64 {
		if w[i] == 0 {
			return math.Inf(1)
		}
		return max(demands[i], 0) / w[i]
	}
	slices.SortStableFunc(order, func(a, b int) int {
		da, db := dw(a), dw(b)
		switch {
		case da < db:
			return -1
		case da > db:
			return 1
		}
		return 0
	})
	left, wleft := budget, sum
	level := 0.0 // budget per unit of weight left to the rules not yet satisfied
	for k, i := range order {
		if wleft <= 0 {
			break
		}
		level = left / wleft
		if w[i] > 0 && dw(i) <= level {
			left -= max(demands[i], 0)
			wleft -= w[i]
			continue
		}
		// Every rule from here on demands more than the level: each gets it.
		for _, j := range order[k:] {
			q[j] = level * w[j]
		}
		wleft = 0
		break
	}
	if wleft > 0 {
		level = left / wleft // everyone satisfied: the rest is headroom
	}
	for i := range n {
		guarantee := budget * w[i] / sum
		// A satisfied rule keeps its guarantee, or its share of what is left when
		// that is more.
		q[i] = max(q[i], guarantee, level*w[i], floor)
	}
	return q
}

// Rule is one rule's input to the Controller for one interval: its identity (stable
// across intervals), its configured weight, and what it demanded (new connections or
// packets per second it was sent, admitted or not) and had admitted.
type Rule struct {
	ID       int
	Weight   float64
	Demand   float64
	Admitted float64
}

// Params set a Controller.
type Params struct {
	// High, Low and Hold are the watermarks (see Watermarks).
	High, Low float64
	Hold      time.Duration
	// ByShare makes quotas follow each rule's recent share of the demand, measured
	// while the LD was not protecting (an average over about ShareWindow), instead of
	// its configured weight.
	ByShare     bool
	ShareWindow time.Duration
	// Floor is the least quota a rule gets, per second.
	Floor float64
	// Keep, when positive, makes each rule's quota at least Keep times its average
	// demand while the LD was not protecting (over about ShareWindow, the average
	// quotas by share follow): a rule that has not surged keeps its rate even when
	// the budget falls low because the load does not answer the quotas (replies,
	// retransmissions of connections already admitted).
	Keep float64
}

// Result is what the Controller decided for one interval.
type Result struct {
	Protecting bool
	Changed    bool // the state changed at this step
	// Budget is the total per second shared out; 0 when not protecting.
	Budget float64
	// Quotas are the rules' quotas per second, in the order of the rules given; nil
	// when not protecting.
	Quotas []float64
}

// Controller turns the load and the rules' rates of each interval into quotas. While
// the LD is not protecting it keeps each rule's average demand (its share); while
// protecting, the budget (the total rate quotas share out) is what was admitted in the
// last interval scaled by target ÷ load, where target is halfway between the
// watermarks, moving by at most a halving or a doubling per step and never above
// twice the demand: quotas tighten while the load stays above the target and loosen
// as it falls, until the load the rules would make without them stays below Low and
// they are lifted. It is used by one goroutine.
type Controller struct {
	P      Params
	wm     Watermarks
	budget float64
	share  map[int]float64 // by rule ID: average demand while normal
	last   time.Time
}

// NewController makes a controller with p.
func NewController(p Params) *Controller {
	return &Controller{P: p, wm: Watermarks{High: p.High, Low: p.Low, Hold: p.Hold}, share: map[int]float64{}}
}

// Watermarks returns the controller's state machine (read only).
func (c *Controller) Watermarks() *Watermarks { return &c.wm }

// Step takes the load and the rules' rates over the interval that ended at now and
// returns the quotas for the next. While protecting, the watermarks compare the load
// as it would be without the quotas: the load times what the rules asked for over
// what they were admitted (a surge still going on keeps the quotas, however well they
// hold the load down; once it is over the two are the same).
func (c *Controller) Step(now time.Time, load float64, rules []Rule) Result {
	c.wm.High, c.wm.Low, c.wm.Hold = c.P.High, c.P.Low, c.P.Hold
	was, _ := c.wm.Protecting()
	eff := load
	if was {
		demand, admitted := totals(rules)
		if admitted > 0 && demand > admitted {
			eff = load * demand / admitted
		} else if admitted == 0 && demand > 0 {
			eff = max(load, c.P.High)
		}
	}
	prot, changed := c.wm.Update(eff, now)
	return c.quotas(now, load, rules, prot, changed)
}

// Follow is Step for a controller whose state another controller decides (r, that
// controller's result for the same interval): the packet quotas follow the
// connection quotas' state.
func (c *Controller) Follow(now time.Time, load float64, rules []Rule, r Result) Result {
	return c.quotas(now, load, rules, r.Protecting, r.Changed)
}

func totals(rules []Rule) (demand, admitted float64) {
	for _, r := range rules {
		demand += max(r.Demand, 0)
		admitted += max(r.Admitted, 0)
	}
	return demand, admitted
}

// quotas computes the budget and the quotas for state prot.
func (c *Controller) quotas(now time.Time, load float64, rules []Rule, prot, changed bool) Result {
	dt := time.Second
	if !c.last.IsZero() {
		dt = max(now.Sub(c.last), time.Millisecond)
	}
	c.last = now
	demand, admitted := totals(rules)
	if !prot {
		c.budget = 0
		c.learnShares(rules, dt)
		return Result{Changed: changed}
	}
	// The budget scales what was admitted by target ÷ load, both measured over the
	// same interval, so a measurement late by an interval is not compounded; it moves
	// by at most a halving or a doubling a step.
	target := (c.P.High + c.P.Low) / 2
	factor := 2.0
	if load > 0 {
		factor = min(max(target/load, 0.5), 2)
	}
	next := admitted * factor
	if c.budget > 0 && !(prot && changed) {
		next = min(max(next, c.budget/2), 2*c.budget)
	}
	c.budget = min(next, 2*demand)
	c.budget = max(c.budget, c.P.Floor*float64(len(rules)))
	weights := make([]float64, len(rules))
	demands := make([]float64, len(rules))
	for i, r := range rules {
		weights[i] = r.Weight
		if c.P.ByShare {
			weights[i] = c.share[r.ID]
		}
		demands[i] = r.Demand
	}
	q := Split(c.budget, weights, demands, c.P.Floor)
	if c.P.Keep > 0 {
		for i, r := range rules {
			q[i] = max(q[i], c.P.Keep*c.share[r.ID])
		}
	}
	return Result{Protecting: true, Changed: changed, Budget: c.budget, Quotas: q}
}

// learnShares folds one normal interval's demands into the rules' average shares
// (an exponential average with time constant ShareWindow) and forgets rules no
// longer given.
func (c *Controller) learnShares(rules []Rule, dt time.Duration) {
	win := c.P.ShareWindow
	if win <= 0 {
		win = time.Minute
	}
	a := 1 - math.Exp(-dt.Seconds()/win.Seconds())
	seen := make(map[int]bool, len(rules))
	for _, r := range rules {
		seen[r.ID] = true
		old, ok := c.share[r.ID]
		if !ok {
			c.share[r.ID] = max(r.Demand, 0)
			continue
		}
		c.share[r.ID] = old + a*(max(r.Demand, 0)-old)
	}
	for id := range c.share {
		if !seen[id] {
			delete(c.share, id)
		}
	}
}

// Share returns rule id's average demand per second while normal, what quotas by
// share follow.
func (c *Controller) Share(id int) float64 { return c.share[id] }
