package route

import (
	"bufio"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func respond(body string) Action { return Action{Respond: &Respond{Status: 200, Body: body}} }

func matchConfig() *Config {
	return &Config{
		Pools: []Pool{{Name: "web", Members: members("192.0.2.1:80")}},
		Listeners: []Listener{
			{
				Name: "web",
				VHosts: []VHost{
					{
						Names: []string{"example.com", "www.example.com"},
						Routes: []Route{
							{Name: "home", Match: Match{Path: "/", Methods: []string{"GET"}}, Action: respond("home")},
							{Name: "api-v2", Match: Match{PathPrefix: "/api/", Headers: []HeaderMatch{{Name: "x-version", Exact: "2"}}}, Action: Action{Pool: "web"}},
							{Name: "api", Match: Match{PathPrefix: "/api/"}, Action: Action{Pool: "web"}},
							{Name: "user", Match: Match{PathRegex: "/users/[0-9]+"}, Action: Action{Pool: "web"}},
							{Name: "status", Match: Match{Path: "/api/status"}, Action: respond("shadowed")},
							{Name: "submit", Match: Match{Path: "/submit", Methods: []string{"POST", "PUT"}}, Action: Action{Pool: "web"}},
							{Name: "debug", Match: Match{PathPrefix: "/debug", Headers: []HeaderMatch{{Name: "X-Debug", Present: true, Invert: true}}}, Action: Action{Respond: &Respond{Status: 403}}},
							{Name: "tenant", Match: Match{PathPrefix: "/t/", Headers: []HeaderMatch{{Name: "X-Tenant", Regex: "t-[0-9]+"}}}, Action: respond("tenant")},
							{Name: "catch", Action: Action{Pool: "web"}},
						},
					},
					{Names: []string{"*.example.com"}, Routes: []Route{{Name: "wild", Action: respond("wild")}}},
					{Names: []string{"*.a.example.com"}, Routes: []Route{{Name: "deep", Action: respond("deep")}}},
					{Names: []string{"[2001:db8::1]", "192.0.2.80"}, Routes: []Route{{Name: "literal", Action: respond("literal")}}},
					{Names: []string{"*"}, Routes: []Route{{Name: "default", Action: respond("default")}}},
				},
			},
			{
				Name: "order",
				VHosts: []VHost{{
					Names: []string{"*"},
					Routes: []Route{
						{Name: "a", Match: Match{PathPrefix: "/a"}, Action: respond("")},
						{Name: "a/b", Match: Match{PathPrefix: "/a/b"}, Action: respond("")},
						{Name: "x-regex", Match: Match{PathRegex: "/x/.*"}, Action: respond("")},
						{Name: "x-exact", Match: Match{Path: "/x/y"}, Action: respond("")},
						{Name: "p/q", Match: Match{PathPrefix: "/p/q"}, Action: respond("")},
						{Name: "p", Match: Match{PathPrefix: "/p"}, Action: respond("")},
						{Name: "get-only", Match: Match{Path: "/m", Methods: []string{"GET"}}, Action: respond("")},
						{Name: "m-prefix", Match: Match{PathPrefix: "/m"}, Action: respond("")},
						{Name: "empty-exact", Match: Match{PathPrefix: "/e", Headers: []HeaderMatch{{Name: "X-E", Exact: "1"}}}, Action: respond("")},
						{Name: "q-digits", Match: Match{PathRegex: "/q/[0-9]+"}, Action: respond("")},
						{Name: "q-prefix", Match: Match{PathPrefix: "/q/"}, Action: respond("")},
						{Name: "case-insensitive", Match: Match{PathRegex: "(?i)/CASE/.*"}, Action: respond("")},
						{Name: "alternation", Match: Match{PathRegex: "/zalt1|/zalt2"}, Action: respond("")},
					},
				}},
			},
			{
				Name:   "other",
				VHosts: []VHost{{Names: []string{"example.com"}, Routes: []Route{{Name: "other", Action: respond("other")}}}},
			},
		},
	}
}

func TestMatch(t *testing.T) {
	tab := mustCompile(t, matchConfig())
	tests := []struct {
		listener, host, method, path string
		hdr                          map[string]string
		want                         string // route name, "" for no match
	}{
		{"web", "example.com", "GET", "/", nil, "home"},
		{"web", "EXAMPLE.com:443", "GET", "/", nil, "home"},
		{"web", "example.com.", "GET", "/", nil, "home"},
		{"web", "www.example.com", "GET", "/", nil, "home"},
		{"web", "example.com", "HEAD", "/", nil, "catch"},
		{"web", "example.com", "GET", "/api/x", map[string]string{"X-Version": "2"}, "api-v2"},
		{"web", "example.com", "GET", "/api/x", map[string]string{"X-Version": "3"}, "api"},
		{"web", "example.com", "GET", "/api/x", nil, "api"},
		{"web", "example.com", "GET", "/api", nil, "catch"},
		{"web", "example.com", "GET", "/api/status", nil, "api"},
		{"web", "example.com", "GET", "/users/42", nil, "user"},
		{"web", "example.com", "GET", "/users/4x2", nil, "catch"},
		{"web", "example.com", "GET", "/users/42/orders", nil, "catch"},
		{"web", "example.com", "GET", "/x/users/42", nil, "catch"},
		{"web", "example.com", "POST", "/submit", nil, "submit"},
		{"web", "example.com", "PUT", "/submit", nil, "submit"},
		{"web", "example.com", "GET", "/submit", nil, "catch"},
		{"web", "example.com", "GET", "/debug/pprof", nil, "debug"},
		{"web", "example.com", "GET", "/debug/pprof", map[string]string{"X-Debug": ""}, "catch"},
		{"web", "example.com", "GET", "/t/x", map[string]string{"X-Tenant": "t-17"}, "tenant"},
		{"web", "example.com", "GET", "/t/x", map[string]string{"X-Tenant": "t-17x"}, "catch"},
		{"web", "example.com", "GET", "/t/x", map[string]string{"X-Tenant": "xt-17"}, "catch"},
		{"web", "foo.example.com", "GET", "/", nil, "wild"},
		{"web", "a.example.com", "GET", "/", nil, "wild"},
		{"web", "x.a.example.com", "GET", "/", nil, "deep"},
		{"web", "y.x.a.example.com:8443", "GET", "/", nil, "deep"},
		{"web", "b.x.example.com", "GET", "/", nil, "wild"},
		{"web", "[2001:db8::1]:443", "GET", "/", nil, "literal"},
		{"web", "192.0.2.80:443", "GET", "/", nil, "literal"},
		{"web", "example.org", "GET", "/", nil, "default"},
		{"web", "com", "GET", "/", nil, "default"},
		{"web", ".example.com", "GET", "/", nil, "default"},
		{"web", "", "GET", "/", nil, "default"},
		{"web", strings.Repeat("a", 300) + ".example.com", "GET", "/", nil, "default"},
		{"order", "any", "GET", "/a/b/c", nil, "a"},
		{"order", "any", "GET", "/x/y", nil, "x-regex"},
		{"order", "any", "GET", "/p/q/r", nil, "p/q"},
		{"order", "any", "GET", "/p/r", nil, "p"},
		{"order", "any", "GET", "/m", nil, "get-only"},
		{"order", "any", "POST", "/m", nil, "m-prefix"},
		{"order", "any", "GET", "/e", map[string]string{"X-E": "1"}, "empty-exact"},
		{"order", "any", "GET", "/e", nil, ""},
		{"order", "any", "GET", "/q/12", nil, "q-digits"},
		{"order", "any", "GET", "/q/1a", nil, "q-prefix"},
		{"order", "any", "GET", "/case/x", nil, "case-insensitive"},
		{"order", "any", "GET", "/CaSe/x", nil, "case-insensitive"},
		{"order", "any", "GET", "/zalt2", nil, "alternation"},
		{"order", "any", "GET", "/zalt3", nil, ""},
		{"order", "any", "GET", "/zzz", nil, ""},
		{"other", "example.com", "GET", "/", nil, "other"},
		{"other", "example.org", "GET", "/", nil, ""},
		{"nope", "example.com", "GET", "/", nil, ""},
	}
	for _, tt := range tests {
		r, ok := tab.Match(tt.listener, []byte(tt.host), []byte(tt.method), []byte(tt.path), headers(tt.hdr))
		got := ""
		if ok {
			got = r.Name()
		}
		if got != tt.want || ok != (r != nil) {
			t.Errorf("Match(%s %s %s %s %v) = %q, %v; want %q", tt.listener, tt.host, tt.method, tt.path, tt.hdr, got, ok, tt.want)
		}
		if ok && r.Listener() != tt.listener {
			t.Errorf("route %q: listener %q", got, r.Listener())
		}
	}
	// A nil HeaderFunc is a request without headers.
	if r, ok := tab.Match("web", []byte("example.com"), []byte("GET"), []byte("/debug"), nil); !ok || r.Name() != "debug" {
		t.Errorf("nil header func: %v %v", r, ok)
	}
}

// TestMatchFasthttp matches requests read by fasthttp, as l7 will.
func TestMatchFasthttp(t *testing.T) {
	tab := mustCompile(t, matchConfig())
	for _, tt := range []struct{ raw, want string }{
		{"GET /users/7?x=1 HTTP/1.1\r\nHost: Example.COM\r\n\r\n", "user"},
		{"GET /api/v HTTP/1.1\r\nHost: www.example.com\r\nx-version: 2\r\n\r\n", "api-v2"},
		{"GET /debug HTTP/1.1\r\nHost: example.com\r\nX-Debug:\r\n\r\n", "catch"},
		{"GET /a/../submit HTTP/1.1\r\nHost: example.com\r\n\r\n", "catch"},
		{"POST /a/../submit HTTP/1.1\r\nHost: example.com\r\nContent-Length: 0\r\n\r\n", "submit"},
	} {
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(strings.NewReader(tt.raw))); err != nil {
			t.Fatal(err)
		}
		r, ok := tab.Match("web", req.Host(), req.Header.Method(), req.URI().Path(), req.Header.Peek)
		if !ok || r.Name() != tt.want {
			t.Errorf("%q: got %v %v, want %s", tt.raw, r, ok, tt.want)
		}
		if n := testing.AllocsPerRun(100, func() {
			tab.Match("web", req.Host(), req.Header.Method(), req.URI().Path(), req.Header.Peek)
		}); n != 0 {
			t.Errorf("%q: Match with fasthttp's Peek: %v allocations", tt.raw, n)
		}
	}
}

func TestMatchAllocs(t *testing.T) {
	tab := mustCompile(t, matchConfig())
	host, get, path := []byte("Foo.Example.com:443"), []byte("GET"), []byte("/users/42")
	hdr := headers(map[string]string{"X-Tenant": "t-1"})
	for _, tc := range []struct{ host, path string }{{"foo.example.com", "/"}, {"example.com", "/users/42"}, {"example.com", "/t/x"}, {"example.com", "/api/status"}} {
		host, path = []byte(tc.host), []byte(tc.path)
		if n := testing.AllocsPerRun(100, func() {
			if _, ok := tab.Match("web", host, get, path, hdr); !ok {
				t.Fatal("no match")
			}
		}); n != 0 {
			t.Errorf("Match %s%s: %v allocations", tc.host, tc.path, n)
		}
	}
}

func TestRouteActions(t *testing.T) {
	c := &Config{
		Pools: []Pool{{Name: "web", Members: members("192.0.2.1:80")}},
		Listeners: []Listener{{Name: "l", VHosts: []VHost{{Names: []string{"*"}, Routes: []Route{
			{Name: "to-https", Match: Match{PathPrefix: "/s/"}, Action: Action{Redirect: &Redirect{Scheme: "https", Code: 308}}},
			{Name: "moved", Match: Match{PathPrefix: "/m/"}, Action: Action{Redirect: &Redirect{Host: "example.net:8443", Path: "/new", StripQuery: true}}},
			{Name: "url", Match: Match{PathPrefix: "/u/"}, Action: Action{Redirect: &Redirect{URL: "https://example.org/x?y=1", Code: 301}}},
			{Name: "same-host", Match: Match{PathPrefix: "/h/"}, Action: Action{Redirect: &Redirect{Path: "/elsewhere"}}},
			{Name: "teapot", Match: Match{Path: "/tea"}, Action: Action{Respond: &Respond{Status: 418, Body: "short and stout"}}},
			{Name: "json", Match: Match{Path: "/j"}, Action: Action{Respond: &Respond{Status: 200, Body: "{}", ContentType: "application/json"}}},
			{Name: "empty", Match: Match{Path: "/e"}, Action: Action{Respond: &Respond{Status: 204}}},
			{
				Name: "proxy", Action: Action{Pool: "web"}, Retries: 2,
				RequestHeaders: HeaderEdits{
					Remove: []string{"x-internal"}, Set: []HeaderValue{{Name: "x-route", Value: "proxy"}},
					Add: []HeaderValue{{Name: "X-Tag", Value: "b"}},
				},
				ResponseHeaders: HeaderEdits{Set: []HeaderValue{{Name: "Server", Value: "tiergate"}}},
			},
		}}}}},
	}
	tab := mustCompile(t, c)
	get := func(path string) *CompiledRoute {
		r, ok := tab.Match("l", []byte("h"), []byte("GET"), []byte(path), nil)
		if !ok {
			t.Fatalf("%s: no match", path)
		}
		return r
	}
	for _, tt := range []struct {
		path, host, uri string
		code            int
		want            string
	}{
		{"/s/", "example.com:8080", "/s/a?b=c", 308, "https://example.com/s/a?b=c"},
		{"/s/", "[2001:db8::1]:8080", "/s/a", 308, "https://[2001:db8::1]/s/a"},
		{"/m/", "example.com", "/m/a?b=c", 302, "https://example.net:8443/new"},
		{"/u/", "example.com", "/u/a?b=c", 301, "https://example.org/x?y=1"},
		{"/h/", "example.com:8443", "/h/a?q", 302, "https://example.com:8443/elsewhere?q"},
	} {
		r := get(tt.path)
		if r.Kind() != ActionRedirect || r.RedirectCode() != tt.code {
			t.Errorf("%s: kind %v code %d", tt.path, r.Kind(), r.RedirectCode())
		}
		if got := string(r.AppendLocation(nil, "https", []byte(tt.host), []byte(tt.uri))); got != tt.want {
			t.Errorf("%s %s: Location %q, want %q", tt.host, tt.uri, got, tt.want)
		}
	}
	for _, tt := range []struct {
		path        string
		status      int
		body, ctype string
	}{
		{"/tea", 418, "short and stout", "text/plain; charset=utf-8"},
		{"/j", 200, "{}", "application/json"},
		{"/e", 204, "", ""},
	} {
		r := get(tt.path)
		p := r.Respond()
		if r.Kind() != ActionRespond || p.Status() != tt.status || string(p.Body()) != tt.body || p.ContentType() != tt.ctype {
			t.Errorf("%s: %v %d %q %q", tt.path, r.Kind(), p.Status(), p.Body(), p.ContentType())
		}
	}

	r := get("/anything")
	if r.Kind() != ActionProxy || r.Pool().Name() != "web" || r.Timeout() != DefaultTimeout || r.Retries() != 2 {
		t.Fatalf("proxy route: %v %v %v %v", r.Kind(), r.Pool(), r.Timeout(), r.Retries())
	}
	if r.Respond() != nil || r.RedirectCode() != 0 || get("/tea").Pool() != nil {
		t.Error("accessors of other kinds are not zero")
	}
	if _, err := get("/tea").Do(testIP, nil, []byte("GET"), func(*Member) Outcome { return Success }); !errors.Is(err, ErrNotProxy) {
		t.Errorf("Do on a fixed response: %v", err)
	}
	for _, tt := range []struct {
		attempt int
		method  string
		o       Outcome
		want    bool
	}{
		{1, "GET", ConnectFailure, true},
		{2, "PUT", ConnectFailure, true},
		{3, "GET", ConnectFailure, false},
		{1, "POST", ConnectFailure, false},
		{1, "GET", Failure, false},
		{1, "GET", Success, false},
	} {
		if got := r.Retry(tt.attempt, []byte(tt.method), tt.o); got != tt.want {
			t.Errorf("Retry(%d, %s, %v) = %v", tt.attempt, tt.method, tt.o, got)
		}
	}

	var fh fasthttp.RequestHeader
	fh.Set("X-Internal", "secret")
	fh.Set("X-Route", "client")
	fh.Add("X-Tag", "a")
	r.RequestHeaders().Apply(&fh)
	if fh.Peek("X-Internal") != nil || string(fh.Peek("X-Route")) != "proxy" {
		t.Errorf("fasthttp request headers after edits:\n%s", fh.Header())
	}
	var tags []string
	for _, v := range fh.PeekAll("X-Tag") {
		tags = append(tags, string(v))
	}
	if strings.Join(tags, ",") != "a,b" {
		t.Errorf("X-Tag = %v", tags)
	}
	hh := http.Header{"Server": {"backend"}}
	r.ResponseHeaders().Apply(hh)
	if hh.Get("Server") != "tiergate" || len(hh["Server"]) != 1 {
		t.Errorf("response headers: %v", hh)
	}
	if !get("/tea").RequestHeaders().Empty() || r.RequestHeaders().Empty() {
		t.Error("Empty")
	}
	var fr fasthttp.ResponseHeader
	r.ResponseHeaders().Apply(&fr)
	if string(fr.Peek("Server")) != "tiergate" {
		t.Errorf("fasthttp response: %s", fr.Header())
	}
}

func TestRouteDo(t *testing.T) {
	c := poolOnly(Pool{
		Name: "p", Members: members("192.0.2.1:80", "192.0.2.2:80", "192.0.2.3:80", "192.0.2.4:80"),
		PassiveEjection: &Ejection{ConsecutiveFailures: 1, EjectionTime: Duration(time.Hour), MaxEjectedPercent: 100},
	})
	c.Listeners[0].VHosts[0].Routes[0].Retries = 2
	tab := mustCompile(t, c)
	r, _ := tab.Match("l", nil, []byte("GET"), []byte("/"), nil)

	var seen []string
	fail := func(o Outcome) func(*Member) Outcome {
		return func(m *Member) Outcome {
			seen = append(seen, m.Addr())
			return o
		}
	}
	// Connection failures on an idempotent request: three different members, then
	// the retries are spent.
	o, err := r.Do(testIP, nil, []byte("GET"), fail(ConnectFailure))
	if err != nil || o != ConnectFailure || len(seen) != 3 || seen[0] == seen[1] || seen[1] == seen[2] || seen[0] == seen[2] {
		t.Fatalf("Do = %v, %v after %v", o, err, seen)
	}
	// Each failed member was reported, and ejected; none is left outstanding.
	ejected := 0
	for _, m := range r.Pool().Members() {
		if m.Outstanding() != 0 {
			t.Errorf("%s: %d outstanding", m.Addr(), m.Outstanding())
		}
		if m.Ejected() {
			ejected++
		}
	}
	if ejected != 3 {
		t.Errorf("%d members ejected, want 3", ejected)
	}
	// A POST is not retried; neither is a failure after connecting.
	seen = nil
	if o, _ := r.Do(testIP, nil, []byte("POST"), fail(ConnectFailure)); o != ConnectFailure || len(seen) != 1 {
		t.Errorf("POST: %v after %v", o, seen)
	}
	// All members ejected now: nothing to pick.
	if _, err := r.Do(testIP, nil, []byte("GET"), fail(Success)); !errors.Is(err, ErrNoHealthyMember) {
		t.Errorf("Do with every member ejected: %v", err)
	}

	tab = mustCompile(t, c)
	r, _ = tab.Match("l", nil, []byte("GET"), []byte("/"), nil)
	calls := 0
	ok := func(m *Member) Outcome { calls++; return Success }
	if n := testing.AllocsPerRun(100, func() { _, _ = r.Do(testIP, nil, []byte("GET"), ok) }); n != 0 {
		t.Errorf("Do: %v allocations", n)
	}
	seen = nil
	if o, _ := r.Do(testIP, nil, []byte("GET"), fail(Failure)); o != Failure || len(seen) != 1 {
		t.Errorf("Failure retried: %v", seen)
	}
}
