package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tiergate/tiergate/bench/benchkit"
	"github.com/tiergate/tiergate/policy/route"
)

// The routing table: routeVHosts virtual hosts (40 with two exact names each, 9
// wildcards, the default) of the routes in vhostRoutes each.
const (
	routeVHosts    = 50
	exactVHosts    = 40
	routeListener  = "https"
	defaultVHostIx = routeVHosts - 1
)

// vhostRoutes are the routes of every virtual host, in order: what a typical site
// has, a header-conditioned API route first and a catch-all last. Each is the YAML of
// one route, indented under "routes:".
var vhostRoutes = []string{
	`{match: {path_prefix: /api/, headers: [{name: X-Api-Version, exact: "2"}]}, action: {pool: web}}`,
	`{match: {path: /}, action: {pool: web}}`,
	`{match: {path: /healthz}, action: {respond: {status: 200, body: ok}}}`,
	`{match: {path: /login, methods: [GET, POST]}, action: {pool: web}}`,
	`{match: {path: /logout}, action: {pool: web}}`,
	`{match: {path: /v1/status}, action: {pool: web}}`,
	`{match: {path: /favicon.ico}, action: {pool: web}}`,
	`{match: {path_regex: '/v1/users/[0-9]+/avatar'}, action: {pool: web}}`,
	`{match: {path_regex: '/products/[a-z0-9-]+'}, action: {pool: web}}`,
	`{match: {path_regex: '/blog/[0-9]{4}/[0-9]{2}/.+'}, action: {pool: web}}`,
	`{match: {path_regex: '/download/.+\.(zip|tar\.gz)'}, action: {pool: web}}`,
	`{match: {path_prefix: /v1/users/}, action: {pool: web}}`,
	`{match: {path_prefix: /v1/orders/, methods: [GET, POST]}, action: {pool: web}}`,
	`{match: {path_prefix: /v2/}, action: {pool: web}}`,
	`{match: {path_prefix: /static/}, action: {pool: web}}`,
	`{match: {path_prefix: /assets/}, action: {pool: web}}`,
	`{match: {path_prefix: /api/internal/, headers: [{name: X-Internal, present: true}]}, action: {redirect: {scheme: https, host: internal.example.com}}}`,
	`{match: {path_prefix: /admin/, headers: [{name: X-Admin-Token, present: true}]}, action: {pool: web}}`,
	`{match: {path_prefix: /img/}, action: {pool: web}}`,
	`{action: {pool: web}}`,
}

// routeConfigYAML is the 1,000-route configuration, as an operator would write it.
func routeConfigYAML() string {
	var b strings.Builder
	b.WriteString("pools:\n  - name: web\n    members: [{addr: \"192.0.2.10:8080\"}, {addr: \"192.0.2.11:8080\"}]\n")
	fmt.Fprintf(&b, "listeners:\n  - name: %s\n    vhosts:\n", routeListener)
	for v := range routeVHosts {
		var names string
		switch {
		case v < exactVHosts:
			names = fmt.Sprintf("[svc%d.example.com, www.svc%d.example.com]", v, v)
		case v < defaultVHostIx:
			names = fmt.Sprintf("[\"*.tenant%d.example.net\"]", v)
		default:
			names = `["*"]`
		}
		fmt.Fprintf(&b, "      - names: %s\n        routes:\n", names)
		for _, r := range vhostRoutes {
			fmt.Fprintf(&b, "          - %s\n", r)
		}
	}
	return b.String()
}

// header is a request's headers as the l7 handler has them: a short list searched
// in order, as fasthttp's RequestHeader.Peek does.
type header [][2]string

func (h header) lookup(name string) []byte {
	for _, kv := range h {
		if kv[0] == name {
			return []byte(kv[1])
		}
	}
	return nil
}

// routeRequest is one request of the mix and the route it must match.
type routeRequest struct {
	name               string
	host, method, path []byte
	header             route.HeaderFunc
	vhost, route       int
}

func (r *routeRequest) want() string { return fmt.Sprintf("vhosts[%d].routes[%d]", r.vhost, r.route) }

func routeRequests() []routeRequest {
	common := header{{"User-Agent", "Mozilla/5.0"}, {"Accept", "*/*"}, {"Accept-Encoding", "gzip, br"}}
	with := func(kv ...[2]string) route.HeaderFunc { return append(append(header{}, common...), kv...).lookup }
	rq := func(name, host, method, path string, h route.HeaderFunc, vhost, rt int) routeRequest {
		return routeRequest{name, []byte(host), []byte(method), []byte(path), h, vhost, rt}
	}
	none := common.lookup
	return []routeRequest{
		rq("exact path", "svc7.example.com", "GET", "/v1/status", none, 7, 5),
		rq("exact path, Host with port", "WWW.Svc31.Example.com:443", "GET", "/", none, 31, 1),
		rq("prefix", "svc12.example.com", "GET", "/static/js/app.3f9a.js", none, 12, 14),
		rq("prefix + method", "svc3.example.com", "POST", "/v1/orders/981", none, 3, 12),
		rq("prefix + header", "svc20.example.com", "GET", "/api/items", with([2]string{"X-Api-Version", "2"}), 20, 0),
		rq("prefix, header missing", "svc21.example.com", "GET", "/api/items", none, 21, 19),
		rq("prefix + header present", "svc5.example.com", "GET", "/admin/users", with([2]string{"X-Admin-Token", "t0k"}), 5, 17),
		rq("regex", "svc25.example.com", "GET", "/v1/users/12345/avatar", none, 25, 7),
		rq("regex fails, prefix", "svc25.example.com", "GET", "/v1/users/12345/profile", none, 25, 11),
		rq("wildcard host, regex", "shop.tenant44.example.net", "GET", "/products/blue-shoe-42", none, 44, 8),
		rq("default host, prefix", "unknown.example.org", "GET", "/img/logo.png", none, defaultVHostIx, 18),
		rq("catch-all", "svc39.example.com", "GET", "/some/page/nobody/routes", none, 39, 19),
	}
}

// routeKind is the time to match one kind of request.
type routeKind struct {
	Name    string  `json:"name"`
	Route   string  `json:"route"`
	NsMatch float64 `json:"ns_per_match"`
}

type routeResults struct {
	Routes     int         `json:"routes"`
	VHosts     int         `json:"vhosts"`
	CompileMs  float64     `json:"parse_compile_ms"`
	MixNs      float64     `json:"mix_ns_per_match"`
	Kinds      []routeKind `json:"kinds"`
	OtherCores float64     `json:"other_processes_cores"`
}

func (b *bench) runRoute(ctx context.Context) error {
	b.Progress("routing: parsing and compiling %d routes, then %d matches over a mix of %d requests", routeVHosts*len(vhostRoutes), b.o.matches, len(routeRequests()))
	text := routeConfigYAML()
	t0 := time.Now()
	cfg, err := route.Parse([]byte(text))
	if err != nil {
		return fmt.Errorf("parsing the routing configuration: %w", err)
	}
	tab, err := route.Compile(cfg)
	if err != nil {
		return fmt.Errorf("compiling the routing configuration: %w", err)
	}
	res := &routeResults{Routes: len(tab.Routes()), VHosts: routeVHosts, CompileMs: round(benchkit.Ms(time.Since(t0)), 2)}
	if want := routeVHosts * len(vhostRoutes); res.Routes != want {
		return fmt.Errorf("the table has %d routes, want %d", res.Routes, want)
	}

	reqs := routeRequests()
	for i := range reqs {
		rq := &reqs[i]
		r, ok := tab.Match(routeListener, rq.host, rq.method, rq.path, rq.header)
		if !ok || r.Name() != rq.want() {
			got := "no route"
			if ok {
				got = r.Name()
			}
			return fmt.Errorf("%s: %s %s%s matched %s, want %s", rq.name, rq.method, rq.host, rq.path, got, rq.want())
		}
	}
	if err := b.WaitQuiet(ctx, benchkit.SelfCPU); err != nil {
		return err
	}
	others := startOthers(benchkit.SelfCPU)
	timeMatches := func(reqs []routeRequest, n int) (float64, error) {
		start := time.Now()
		for i := range n {
			rq := &reqs[i%len(reqs)]
			if _, ok := tab.Match(routeListener, rq.host, rq.method, rq.path, rq.header); !ok {
				return 0, fmt.Errorf("%s: no match", rq.name)
			}
		}
		return round(float64(time.Since(start).Nanoseconds())/float64(n), 1), nil
	}
	timeMatches(reqs, len(reqs)*1000) // warm-up
	if res.MixNs, err = timeMatches(reqs, b.o.matches); err != nil {
		return err
	}
	for i := range reqs {
		ns, err := timeMatches(reqs[i:i+1], max(b.o.matches/len(reqs), 1))
		if err != nil {
			return err
		}
		res.Kinds = append(res.Kinds, routeKind{Name: reqs[i].name, Route: reqs[i].want(), NsMatch: ns})
	}
	res.OtherCores = round(others.cores(), 2)
	b.route = res
	b.Progress("  %.1f ns per match over the mix; parsed and compiled in %.1f ms; others %.2f cores", res.MixNs, res.CompileMs, res.OtherCores)
	return nil
}
