package route

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoHealthyMember is returned by Pick when every member of the pool is down,
// ejected or excluded: the caller answers 503.
var ErrNoHealthyMember = errors.New("route: no healthy member in the pool")

// ErrUnknownPool is returned by Router.Pick for a pool the current table lacks.
var ErrUnknownPool = errors.New("route: no such pool")

// Defaults of Pool.
const (
	DefaultConnectTimeout    = 3 * time.Second
	DefaultMaxConnsPerMember = 512
)

type policy uint8

const (
	policyRoundRobin policy = iota
	policyLeastRequest
	policyHashClientIP
	policyHashHeader
)

// Balancer is a compiled Pool: its members and how one is picked for a request.
// Members' runtime state (health, ejection, outstanding requests) is shared with the
// Balancers of the same pool in later Tables, for members they keep.
type Balancer struct {
	name              string
	policy            policy
	hashHeader        string
	connectTimeout    time.Duration
	maxConnsPerMember int
	members           []*Member
	ejection          *ejection

	rt     *env
	rr     atomic.Uint64
	maglev []int32         // hashing policies: slot → member index
	draw   func(n int) int // least request's draws in [0, n): rand.IntN (tests: a seeded source)

	mu    sync.Mutex // serialises refresh
	avail atomic.Pointer[availability]
}

// availability is which members may take requests, as of a generation of the
// env's state, with what the policy needs to pick among them.
type availability struct {
	gen  uint64
	up   []bool  // by member index
	list []int32 // indexes of the members up
	seq  []int32 // round robin: the smooth weighted sequence over list
}

// Name is the pool's name.
func (b *Balancer) Name() string { return b.name }

// Members returns the pool's members, in configuration order.
func (b *Balancer) Members() []*Member { return append([]*Member(nil), b.members...) }

// ConnectTimeout bounds a connection attempt to a member.
func (b *Balancer) ConnectTimeout() time.Duration { return b.connectTimeout }

// MaxConnsPerMember bounds the connections open to each member.
func (b *Balancer) MaxConnsPerMember() int { return b.maxConnsPerMember }

// Pick chooses a member for a request by the pool's policy, among the members that
// are up (not failing active health checks, not ejected) and that exclude, when not
// nil, does not reject (retries exclude the members already tried). clientIP and
// header feed the hashing policies ("hash_header" hashes the client IP when the
// header is absent). The member's outstanding count is raised: the caller must call
// Member.Done exactly once when the attempt ends. It returns ErrNoHealthyMember when
// no member qualifies.
func (b *Balancer) Pick(clientIP netip.Addr, header HeaderFunc, exclude func(*Member) bool) (*Member, error) {
	a := b.availability()
	if len(a.list) == 0 {
		return nil, ErrNoHealthyMember
	}
	var m *Member
	switch b.policy {
	case policyRoundRobin:
		m = b.pickRoundRobin(a, exclude)
	case policyLeastRequest:
		m = b.pickLeastRequest(a, exclude)
	default:
		m = b.pickHash(a, b.hashKey(clientIP, header), exclude)
	}
	if m == nil {
		return nil, ErrNoHealthyMember
	}
	m.s.outstanding.Add(1)
	return m, nil
}

func (b *Balancer) hashKey(clientIP netip.Addr, header HeaderFunc) uint64 {
	if b.policy == policyHashHeader && header != nil {
		if v := header(b.hashHeader); len(v) > 0 {
			return hashBytes(v)
		}
	}
	ip := clientIP.Unmap().As16()
	return hashBytes(ip[:])
}

// maxExcludedTries bounds the turns round robin skips for excluded members before
// taking the first member allowed.
const maxExcludedTries = 64

func (b *Balancer) pickRoundRobin(a *availability, exclude func(*Member) bool) *Member {
	n := uint64(len(a.seq))
	for range min(len(a.seq), maxExcludedTries) {
		m := b.members[a.seq[b.rr.Add(1)%n]]
		if exclude == nil || !exclude(m) {
			return m
		}
	}
	return firstAllowed(b, a, exclude)
}

// pickLeastRequest draws two different members at random and takes the one with
// fewer outstanding requests for its weight (the "power of two choices", which
// avoids the herding onto one idle member a full scan causes across many
// proxies).
func (b *Balancer) pickLeastRequest(a *availability, exclude func(*Member) bool) *Member {
	n := len(a.list)
	var m *Member
	if n == 1 {
		m = b.members[a.list[0]]
	} else {
		i := b.draw(n)
		j := b.draw(n - 1)
		if j >= i {
			j++
		}
		x, y := b.members[a.list[i]], b.members[a.list[j]]
		m = x
		if lessLoaded(y, x) {
			m = y
		}
	}
	if exclude == nil || !exclude(m) {
		return m
	}
	var best *Member
	for _, i := range a.list {
		c := b.members[i]
		if !exclude(c) && (best == nil || lessLoaded(c, best)) {
			best = c
		}
	}
	return best
}

// lessLoaded reports whether x has fewer outstanding requests than y for their
// weights.
func lessLoaded(x, y *Member) bool {
	return (x.s.outstanding.Load()+1)*int64(y.weight) < (y.s.outstanding.Load()+1)*int64(x.weight)
}

// pickHash takes the member of the key's Maglev slot, or, when that one is down or
// excluded, of the next slots in turn: keys of members that are up never move.
func (b *Balancer) pickHash(a *availability, key uint64, exclude func(*Member) bool) *Member {
	size := uint64(len(b.maglev))
	slot := key % size
	for range size {
		i := b.maglev[slot]
		if a.up[i] {
			if m := b.members[i]; exclude == nil || !exclude(m) {
				return m
			}
		}
		slot++
		if slot == size {
			slot = 0
		}
	}
	return nil
}

func firstAllowed(b *Balancer, a *availability, exclude func(*Member) bool) *Member {
	for _, i := range a.list {
		if m := b.members[i]; exclude == nil || !exclude(m) {
			return m
		}
	}
	return nil
}

// availability returns the members that are up as of the env's current
// generation, computing them again when it changed.
func (b *Balancer) availability() *availability {
	a := b.avail.Load()
	if a != nil && a.gen == b.rt.gen.Load() {
		return a
	}
	return b.refresh()
}

func (b *Balancer) refresh() *availability {
	b.mu.Lock()
	defer b.mu.Unlock()
	gen := b.rt.gen.Load()
	if a := b.avail.Load(); a != nil && a.gen == gen {
		return a
	}
	a := &availability{gen: gen, up: make([]bool, len(b.members))}
	for i, m := range b.members {
		if m.s.up() {
			a.up[i] = true
			a.list = append(a.list, int32(i))
		}
	}
	if b.policy == policyRoundRobin && len(a.list) > 0 {
		old := b.avail.Load()
		if old != nil && equalInt32(old.list, a.list) {
			a.seq = old.seq
		} else {
			a.seq = b.smoothSequence(a.list)
		}
	}
	b.avail.Store(a)
	return a
}

func equalInt32(x, y []int32) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}

// maxSequence bounds the round-robin sequence. Pools whose weights' period (their
// sum over their greatest common divisor) is longer get the sequence's first part,
// in which each member's share is within one pick of its weight's.
const maxSequence = 1 << 16

// smoothSequence lays out one period of weighted round robin, spread evenly: the
// k-th turn (from 0) of a member of weight w falls at time (k+½)/w, and turns are
// taken in time order, ties to the member listed first. Over a period each member
// has exactly weight/gcd turns, and a member's turns are never bunched more than
// the weights force (2:1 gives A B A A B A, not A A B). This is nginx's smooth
// weighted round robin in another form, built with a heap in O(n log members).
func (b *Balancer) smoothSequence(list []int32) []int32 {
	g, total := 0, 0
	for _, i := range list {
		w := b.members[i].weight
		g = gcd(g, w)
		total += w
	}
	seq := make([]int32, min(total/g, maxSequence))
	h := make(turnHeap, len(list))
	for j, i := range list {
		h[j] = turn{member: i, weight: int64(b.members[i].weight)}
	}
	h.init()
	for k := range seq {
		t := &h[0]
		seq[k] = t.member
		t.k++
		h.down(0)
	}
	return seq
}

// turn is a member's next turn in smoothSequence: number k, at time (2k+1)/(2w).
type turn struct {
	member int32
	weight int64
	k      int64
}

func (t *turn) before(u *turn) bool {
	a, b := (2*t.k+1)*u.weight, (2*u.k+1)*t.weight
	return a < b || a == b && t.member < u.member
}

// turnHeap is a binary min-heap of turns by time.
type turnHeap []turn

func (h turnHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h turnHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Outcome is how a request to a member ended, reported with Member.Done.
type Outcome uint8

// Outcomes.
const (
	// Success: the member answered (with any status the caller does not count as
	// the member's failure).
	Success Outcome = iota
	// Failure: the member was reached but failed: a timeout, a reset, a 5xx answer
	// the caller counts against it.
	Failure
	// ConnectFailure: the member could not be connected to; it saw nothing.
	ConnectFailure
	// Canceled: the attempt ended for a reason that says nothing of the member (the
	// client went away). It only ends the outstanding request.
	Canceled
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case ConnectFailure:
		return "connect_failure"
	case Canceled:
		return "canceled"
	}
	return "unknown"
}

// Member is a member of a Balancer. Its address and weight are those of the Table it
// comes from; its runtime state is shared with the same pool's member of the same
// address in other Tables.
type Member struct {
	addr     string
	weight   int
	index    int
	ejection *ejection
	s        *memberState
}

// Addr is the member's "host:port".
func (m *Member) Addr() string { return m.addr }

// Pool is the name of the member's pool.
func (m *Member) Pool() string { return m.s.pool }

// Weight is the member's weight.
func (m *Member) Weight() int { return m.weight }

// Outstanding is the number of requests picked for the member and not Done yet.
func (m *Member) Outstanding() int64 { return m.s.outstanding.Load() }

// Healthy reports whether the member passes its active health checks (true without
// any).
func (m *Member) Healthy() bool { return !m.s.down.Load() }

// Ejected reports whether the member is ejected for failing requests.
func (m *Member) Ejected() bool { return m.s.ejected.Load() }

// Up reports whether the member may be picked: healthy and not ejected.
func (m *Member) Up() bool { return m.s.up() }

// Done ends a request picked for this member: it lowers the outstanding count and
// feeds passive ejection with the outcome.
func (m *Member) Done(o Outcome) {
	s := m.s
	s.outstanding.Add(-1)
	switch o {
	case Success:
		if s.failures.Load() != 0 {
			s.failures.Store(0)
		}
		return
	case Canceled:
		return
	}
	ej := m.ejection
	if ej == nil || (ej.connectOnly && o != ConnectFailure) {
		return
	}
	if n := s.failures.Add(1); int(n) >= ej.consecutive {
		s.eject(ej)
	}
}

// ejection is a compiled Ejection.
type ejection struct {
	consecutive int
	connectOnly bool
	duration    time.Duration
	maxPercent  int
}

// Defaults of Ejection.
const (
	DefaultConsecutiveFailures = 5
	DefaultEjectionTime        = 30 * time.Second
	DefaultMaxEjectedPercent   = 50
)

func compileEjection(e *Ejection) *ejection {
	if e == nil {
		return nil
	}
	out := &ejection{
		consecutive: e.ConsecutiveFailures,
		connectOnly: e.ConnectFailuresOnly,
		duration:    e.EjectionTime.D(),
		maxPercent:  e.MaxEjectedPercent,
	}
	setDefault(&out.consecutive, DefaultConsecutiveFailures)
	setDefault(&out.duration, DefaultEjectionTime)
	setDefault(&out.maxPercent, DefaultMaxEjectedPercent)
	return out
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// memberState is a member's runtime state, kept by the Router across Tables under
// the pool's name and the member's address.
type memberState struct {
	pool, addr  string
	outstanding atomic.Int64
	down        atomic.Bool // failing active health checks
	ejected     atomic.Bool
	failures    atomic.Int32 // consecutive, for passive ejection

	ps *poolState
	rt *env

	// Guarded by ps.mu.
	ejectTimer *time.Timer
	gone       bool

	checker *checker // guarded by the Router's mu
}

func (s *memberState) up() bool { return !s.down.Load() && !s.ejected.Load() }

// poolState is what members of a pool share: how many are ejected, of how many.
type poolState struct {
	name    string
	mu      sync.Mutex
	size    int
	ejected int
}

func (s *memberState) eject(ej *ejection) {
	ps := s.ps
	ps.mu.Lock()
	if s.gone || s.ejected.Load() || ps.ejected >= max(1, ps.size*ej.maxPercent/100) {
		ps.mu.Unlock()
		return
	}
	s.ejected.Store(true)
	ps.ejected++
	s.ejectTimer = time.AfterFunc(ej.duration, s.unEject)
	ps.mu.Unlock()
	s.rt.m.ejections.WithLabelValues(s.pool).Inc()
	s.rt.log.Warn("pool member ejected", "pool", s.pool, "member", s.addr,
		"consecutive_failures", s.failures.Load(), "for", ej.duration)
	s.rt.changed()
}

func (s *memberState) unEject() {
	ps := s.ps
	ps.mu.Lock()
	if !s.ejected.Load() {
		ps.mu.Unlock()
		return
	}
	s.ejected.Store(false)
	s.failures.Store(0)
	ps.ejected--
	s.ejectTimer = nil
	gone := s.gone
	ps.mu.Unlock()
	if !gone {
		s.rt.log.Info("pool member back from ejection", "pool", s.pool, "member", s.addr)
	}
	s.rt.changed()
}

// forget is called when a Router drops the member: it ends its ejection, so that the
// pool's count stays right.
func (s *memberState) forget() {
	ps := s.ps
	ps.mu.Lock()
	s.gone = true
	t := s.ejectTimer
	ps.mu.Unlock()
	if t != nil && t.Stop() {
		s.unEject()
	}
}
