package route

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// benchConfig is 1,000 routes over 50 virtual hosts (40 exact names, 9 wildcards,
// a default), each with the mix of a typical site: a header-conditioned API route,
// exact paths, regular expressions, prefixes (some with method or header
// conditions), and a catch-all.
func benchConfig() *Config {
	c := &Config{Pools: []Pool{{Name: "web", Members: members("192.0.2.1:80", "192.0.2.2:80")}}}
	l := Listener{Name: "https"}
	proxy := Action{Pool: "web"}
	for v := range 50 {
		var names []string
		switch {
		case v < 40:
			names = []string{fmt.Sprintf("svc%d.example.com", v), fmt.Sprintf("www.svc%d.example.com", v)}
		case v < 49:
			names = []string{fmt.Sprintf("*.tenant%d.example.net", v)}
		default:
			names = []string{"*"}
		}
		routes := []Route{
			{Match: Match{PathPrefix: "/api/", Headers: []HeaderMatch{{Name: "X-Api-Version", Exact: "2"}}}, Action: proxy},
			{Match: Match{Path: "/"}, Action: proxy},
			{Match: Match{Path: "/healthz"}, Action: Action{Respond: &Respond{Status: 200, Body: "ok"}}},
			{Match: Match{Path: "/login", Methods: []string{"GET", "POST"}}, Action: proxy},
			{Match: Match{Path: "/logout"}, Action: proxy},
			{Match: Match{Path: "/v1/status"}, Action: proxy},
			{Match: Match{Path: "/favicon.ico"}, Action: proxy},
			{Match: Match{PathRegex: `/v1/users/[0-9]+/avatar`}, Action: proxy},
			{Match: Match{PathRegex: `/products/[a-z0-9-]+`}, Action: proxy},
			{Match: Match{PathRegex: `/blog/[0-9]{4}/[0-9]{2}/.+`}, Action: proxy},
			{Match: Match{PathRegex: `/download/.+\.(zip|tar\.gz)`}, Action: proxy},
			{Match: Match{PathPrefix: "/v1/users/"}, Action: proxy},
			{Match: Match{PathPrefix: "/v1/orders/", Methods: []string{"GET", "POST"}}, Action: proxy},
			{Match: Match{PathPrefix: "/v2/"}, Action: proxy},
			{Match: Match{PathPrefix: "/static/"}, Action: proxy},
			{Match: Match{PathPrefix: "/assets/"}, Action: proxy},
			{Match: Match{PathPrefix: "/api/internal/"}, Action: proxy},
			{Match: Match{PathPrefix: "/admin/", Headers: []HeaderMatch{{Name: "X-Admin-Token", Present: true}}}, Action: proxy},
			{Match: Match{PathPrefix: "/img/"}, Action: proxy},
			{Action: proxy},
		}
		l.VHosts = append(l.VHosts, VHost{Names: names, Routes: routes})
	}
	c.Listeners = []Listener{l}
	return c
}

// benchGatewayConfig is 1,000 routes in one virtual host, as an API gateway has
// them: for each of 100 services, exact paths, prefixes (some with a method or a
// header condition) and regular expressions, then a catch-all.
func benchGatewayConfig() *Config {
	proxy := Action{Pool: "web"}
	var routes []Route
	for s := range 100 {
		svc := fmt.Sprintf("/svc%d", s)
		routes = append(routes,
			Route{Match: Match{Path: svc + "/status"}, Action: proxy},
			Route{Match: Match{Path: svc + "/healthz"}, Action: proxy},
			Route{Match: Match{Path: svc + "/v1/login", Methods: []string{"POST"}}, Action: proxy},
			Route{Match: Match{PathRegex: svc + `/v1/items/[0-9]+`}, Action: proxy},
			Route{Match: Match{PathRegex: svc + `/v1/users/[0-9]+/(avatar|profile)`}, Action: proxy},
			Route{Match: Match{PathPrefix: svc + "/v2/", Headers: []HeaderMatch{{Name: "X-Api-Version", Exact: "2"}}}, Action: proxy},
			Route{Match: Match{PathPrefix: svc + "/v1/orders/", Methods: []string{"GET", "POST"}}, Action: proxy},
			Route{Match: Match{PathPrefix: svc + "/v1/"}, Action: proxy},
			Route{Match: Match{PathPrefix: svc + "/static/"}, Action: proxy},
			Route{Match: Match{PathPrefix: svc + "/"}, Action: proxy},
		)
	}
	routes[len(routes)-1] = Route{Action: proxy}
	return &Config{
		Pools:     []Pool{{Name: "web", Members: members("192.0.2.1:80")}},
		Listeners: []Listener{{Name: "https", VHosts: []VHost{{Names: []string{"api.example.com"}, Routes: routes}}}},
	}
}

// BenchmarkMatch1000RoutesOneVHost is BenchmarkMatch1000Routes with every route in
// one virtual host, where a first-match scan has the most to try.
func BenchmarkMatch1000RoutesOneVHost(b *testing.B) {
	tab := mustCompile(b, benchGatewayConfig())
	none := headers(nil)
	host := []byte("api.example.com")
	reqs := []benchRequest{
		{name: "exact", path: []byte("/svc87/status"), method: []byte("GET")},
		{name: "prefix", path: []byte("/svc63/static/app.js"), method: []byte("GET")},
		{name: "regex", path: []byte("/svc91/v1/users/77/avatar"), method: []byte("GET")},
		{name: "prefix_after_regex", path: []byte("/svc45/v1/users/77/settings"), method: []byte("GET")},
		{name: "catch_all", path: []byte("/nowhere"), method: []byte("GET")},
	}
	run := func(name string, match func(rq *benchRequest) bool) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				rq := &reqs[i%len(reqs)]
				i++
				if !match(rq) {
					b.Fatal("no match")
				}
			}
		})
	}
	run("mix", func(rq *benchRequest) bool {
		_, ok := tab.Match("https", host, rq.method, rq.path, none)
		return ok
	})
	lt := tab.listeners["https"]
	run("mix_linear_scan", func(rq *benchRequest) bool {
		return linearMatch(lt.vhost(host), rq.method, rq.path, none) != nil
	})
}

type benchRequest struct {
	name               string
	host, method, path []byte
	header             HeaderFunc
	want               int // route index within its virtual host
}

func benchRequests() []benchRequest {
	none := headers(nil)
	api2 := headers(map[string]string{"X-Api-Version": "2"})
	return []benchRequest{
		{"exact", []byte("svc7.example.com"), []byte("GET"), []byte("/v1/status"), none, 5},
		{"exact_host_port", []byte("WWW.Svc31.Example.com:443"), []byte("GET"), []byte("/"), none, 1},
		{"prefix", []byte("svc12.example.com"), []byte("GET"), []byte("/static/js/app.3f9a.js"), none, 14},
		{"prefix_method", []byte("svc3.example.com"), []byte("POST"), []byte("/v1/orders/981"), none, 12},
		{"prefix_header", []byte("svc20.example.com"), []byte("GET"), []byte("/api/items"), api2, 0},
		{"regex", []byte("svc25.example.com"), []byte("GET"), []byte("/v1/users/12345/avatar"), none, 7},
		{"regex_miss_prefix", []byte("svc25.example.com"), []byte("GET"), []byte("/v1/users/12345/profile"), none, 11},
		{"wildcard", []byte("shop.tenant44.example.net"), []byte("GET"), []byte("/products/blue-shoe-42"), none, 8},
		{"default_host", []byte("unknown.example.org"), []byte("GET"), []byte("/img/logo.png"), none, 18},
		{"catch_all", []byte("svc39.example.com"), []byte("GET"), []byte("/some/page/nobody/routes"), none, 19},
	}
}

// BenchmarkMatch1000Routes is the time to route one request through a table of
// 1,000 routes: "mix" cycles through the cases below it.
func BenchmarkMatch1000Routes(b *testing.B) {
	tab := mustCompile(b, benchConfig())
	reqs := benchRequests()
	for _, rq := range reqs {
		r, ok := tab.Match("https", rq.host, rq.method, rq.path, rq.header)
		if !ok || r.Name() != fmt.Sprintf("vhosts[%d].routes[%d]", vhostIndex(r), rq.want) {
			b.Fatalf("%s: matched %v %v, want route %d", rq.name, r, ok, rq.want)
		}
	}
	b.Run("mix", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			rq := &reqs[i%len(reqs)]
			i++
			if _, ok := tab.Match("https", rq.host, rq.method, rq.path, rq.header); !ok {
				b.Fatal("no match")
			}
		}
	})
	// The peer: the same host index, then a plain first-match scan of the routes,
	// as a proxy without path indexes does.
	b.Run("mix_linear_scan", func(b *testing.B) {
		b.ReportAllocs()
		lt := tab.listeners["https"]
		i := 0
		for b.Loop() {
			rq := &reqs[i%len(reqs)]
			i++
			if linearMatch(lt.vhost(rq.host), rq.method, rq.path, rq.header) == nil {
				b.Fatal("no match")
			}
		}
	})
	for _, rq := range reqs {
		b.Run(rq.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := tab.Match("https", rq.host, rq.method, rq.path, rq.header); !ok {
					b.Fatal("no match")
				}
			}
		})
	}
}

// linearMatch is the first route of vh that matches, tried one by one.
func linearMatch(vh *vhostTable, method, path []byte, header HeaderFunc) *CompiledRoute {
	for _, r := range vh.routes {
		if r.matchMethod(method) && r.matchPathSlow(path) && r.matchHeaders(header) {
			return r
		}
	}
	return nil
}

func vhostIndex(r *CompiledRoute) int {
	var v, j int
	_, _ = fmt.Sscanf(r.Name(), "vhosts[%d].routes[%d]", &v, &j)
	return v
}

func BenchmarkPick(b *testing.B) {
	for _, balance := range []string{RoundRobin, LeastRequest, HashClientIP} {
		b.Run(balance, func(b *testing.B) {
			p := Pool{Name: "p", Balance: balance}
			for i := range 16 {
				p.Members = append(p.Members, PoolMember{Addr: fmt.Sprintf("192.0.2.%d:80", i+1), Weight: 1 + i%4})
			}
			pool := mustCompile(b, poolOnly(p)).Pool("p")
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					m, err := pool.Pick(ipN(i&0xffff), nil, nil)
					if err != nil {
						b.Fatal(err)
					}
					m.Done(Success)
					i++
				}
			})
		})
	}
}

func BenchmarkAllow(b *testing.B) {
	r := rateLimitedRoute(b, RateLimit{PerSecond: 1e9, Burst: 1 << 29})
	now := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r.Allow(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), now)
			i = (i + 1) & 0x3ff
		}
	})
}
