package route

import (
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func rateLimitedRoute(t testing.TB, rl RateLimit) *CompiledRoute {
	t.Helper()
	c := &Config{Listeners: []Listener{{Name: "l", VHosts: []VHost{{Names: []string{"*"}, Routes: []Route{
		{Name: "limited", Action: respond("ok"), RateLimit: &rl},
	}}}}}}
	r, ok := mustCompile(t, c).Match("l", nil, []byte("GET"), []byte("/"), nil)
	if !ok {
		t.Fatal("no match")
	}
	return r
}

func TestRateLimitBucket(t *testing.T) {
	r := rateLimitedRoute(t, RateLimit{PerSecond: 2, Burst: 3})
	t0 := time.Unix(1_700_000_000, 0)
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	for i := range 3 {
		if !r.Allow(a, t0) {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	if r.Allow(a, t0) {
		t.Fatal("4th request at once allowed with a burst of 3")
	}
	if !r.Allow(b, t0) {
		t.Fatal("another client refused")
	}
	// 2 per second: one token every 500ms.
	if r.Allow(a, t0.Add(400*time.Millisecond)) {
		t.Error("allowed before a token came back")
	}
	if !r.Allow(a, t0.Add(500*time.Millisecond)) || r.Allow(a, t0.Add(500*time.Millisecond)) {
		t.Error("want exactly one token after 500ms")
	}
	// The bucket holds at most the burst.
	later := t0.Add(time.Hour)
	n := 0
	for r.Allow(a, later) {
		n++
	}
	if n != 3 {
		t.Errorf("after an hour: %d requests allowed at once, want 3", n)
	}
	// A clock going back takes nothing and gives nothing.
	if r.Allow(a, t0) {
		t.Error("allowed with the clock moved back")
	}
	if got := testutil.ToFloat64(r.rateLimited); got != 5 {
		t.Errorf("rate-limited count %v, want 5", got)
	}
}

func TestRateLimitDefaultsAndNoLimit(t *testing.T) {
	r := rateLimitedRoute(t, RateLimit{PerSecond: 2.5})
	if r.limiter.cfg.Burst != 3 || r.limiter.cfg.IPv6PrefixLen != 64 || r.limiter.cfg.MaxClients != DefaultMaxClients {
		t.Errorf("defaults: %+v", r.limiter.cfg)
	}
	plain := &CompiledRoute{}
	for range 1000 {
		if !plain.Allow(testIP, time.Now()) {
			t.Fatal("a route without a limit refused")
		}
	}
}

func TestRateLimitClientKeys(t *testing.T) {
	r := rateLimitedRoute(t, RateLimit{PerSecond: 1, Burst: 1})
	now := time.Unix(1_700_000_000, 0)
	for _, tt := range []struct {
		first, second string
		shared        bool
	}{
		{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9", true},
		{"2001:db8:1:3::1", "2001:db8:1:4::1", false},
		{"192.0.2.9", "::ffff:192.0.2.9", true},
		{"fe80::1%eth0", "fe80::1%eth1", true},
		{"192.0.2.10", "192.0.2.11", false},
	} {
		if !r.Allow(netip.MustParseAddr(tt.first), now) {
			t.Fatalf("%s: first request refused", tt.first)
		}
		if got := !r.Allow(netip.MustParseAddr(tt.second), now); got != tt.shared {
			t.Errorf("%s then %s: shared bucket %v, want %v", tt.first, tt.second, got, tt.shared)
		}
	}
	r128 := rateLimitedRoute(t, RateLimit{PerSecond: 1, Burst: 1, IPv6PrefixLen: 128})
	r128.Allow(netip.MustParseAddr("2001:db8::1"), now)
	if !r128.Allow(netip.MustParseAddr("2001:db8::2"), now) {
		t.Error("/128: two addresses share a bucket")
	}
}

func TestRateLimitBoundedMemory(t *testing.T) {
	l := newLimiter(&RateLimit{PerSecond: 1, Burst: 1, MaxClients: 640})
	now := int64(1e18)
	for i := range 20000 {
		l.allow(ipN(i), now)
	}
	if n := l.clients(); n > 640 {
		t.Fatalf("%d clients tracked, want at most 640", n)
	}
	// A recently seen client is kept; the least recent of its shard goes first.
	var same []netip.Addr
	shard := func(a netip.Addr) uint64 { b := a.As16(); return hashBytes(b[:]) % limiterShards }
	for i := 0; len(same) < 12; i++ {
		a := ipN(50000 + i)
		if shard(a) == 0 {
			same = append(same, a)
		}
	}
	l = newLimiter(&RateLimit{PerSecond: 1e-9, Burst: 1, MaxClients: 10 * limiterShards})
	for _, a := range same[:10] {
		if !l.allow(a, now) {
			t.Fatal("a new client refused")
		}
	}
	l.allow(same[0], now)      // same[0] is now the most recent; same[1] the least
	l.allow(same[10], now)     // evicts same[1]
	if l.allow(same[0], now) { // still tracked, bucket empty
		t.Error("the most recent client was forgotten")
	}
	if !l.allow(same[1], now) { // forgotten, so a full bucket again (evicting same[2])
		t.Error("the least recent client was not the one forgotten")
	}
	if l.allow(same[3], now) {
		t.Error("a client that was not the least recent was forgotten")
	}
}

func TestAllowAllocs(t *testing.T) {
	r := rateLimitedRoute(t, RateLimit{PerSecond: 1e6, Burst: 1000})
	now := time.Now()
	r.Allow(testIP, now)
	if n := testing.AllocsPerRun(1000, func() { r.Allow(testIP, now) }); n != 0 {
		t.Errorf("Allow for a known client: %v allocations", n)
	}
}
