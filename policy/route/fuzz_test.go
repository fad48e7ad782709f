package route

import (
	"bytes"
	"testing"
)

// FuzzMatch feeds client-controlled bytes (Host, method, path, a header value) to
// Match: it must not panic, must be deterministic, and must agree with a plain
// first-match scan of the virtual host's routes.
func FuzzMatch(f *testing.F) {
	tab := mustCompile(f, matchConfig())
	for _, s := range []struct{ host, method, path, hdr string }{
		{"example.com", "GET", "/", ""},
		{"EXAMPLE.COM:443", "POST", "/submit", ""},
		{"x.a.example.com.", "GET", "/users/12", "2"},
		{"[2001:db8::1]:8443", "GET", "/api/x", "2"},
		{"[", "", "", ""},
		{":", "G", "/api", ""},
		{"..", "GET", "/t/", "t-1"},
		{"a.", "GET", "/debug", ""},
	} {
		f.Add(s.host, s.method, s.path, s.hdr)
	}
	f.Fuzz(func(t *testing.T, host, method, path, hv string) {
		h := headers(map[string]string{"X-Version": hv, "X-Tenant": hv})
		r1, ok1 := tab.Match("web", []byte(host), []byte(method), []byte(path), h)
		r2, ok2 := tab.Match("web", []byte(host), []byte(method), []byte(path), h)
		if r1 != r2 || ok1 != ok2 {
			t.Fatal("Match is not deterministic")
		}
		want := linearMatch(tab.listeners["web"].vhost([]byte(host)), []byte(method), []byte(path), h)
		if want != r1 {
			t.Fatalf("Match = %v, a linear scan finds %v", r1, want)
		}
	})
}

// matchPathSlow is the path condition without the indexes.
func (r *CompiledRoute) matchPathSlow(path []byte) bool {
	switch {
	case r.path != "":
		return string(path) == r.path
	case r.pathPrefix != "":
		return bytes.HasPrefix(path, []byte(r.pathPrefix))
	case r.pathRegex != nil:
		return r.pathRegex.Match(path)
	}
	return true
}

// FuzzParse: whatever Parse accepts compiles, and its table matches without
// panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"pools":[{"name":"p","members":[{"addr":"192.0.2.1:80"}]}],"listeners":[{"name":"l","vhosts":[{"names":["*"],"routes":[{"action":{"pool":"p"}}]}]}]}`))
	f.Add([]byte("listeners: [{name: l, vhosts: [{names: ['*.Example.com'], routes: [{match: {path_regex: '/a(b|c)*'}, action: {respond: {status: 204}}}]}]}]"))
	f.Add([]byte("listeners: [{name: l, vhosts: [{names: [x], routes: [{match: {headers: [{name: a, regex: '.*'}]}, action: {redirect: {scheme: http}}}]}]}]"))
	f.Add([]byte("pools: [{name: p, balance: hash_header, hash_header: x-u, members: [{addr: 'h:1', weight: 3}]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		tab, err := Compile(c)
		if err != nil {
			t.Fatalf("Parse accepted what Compile refuses: %v", err)
		}
		for _, l := range c.Listeners {
			tab.Match(l.Name, []byte("a.example.com"), []byte("GET"), []byte("/ab"), headers(map[string]string{"A": "1"}))
		}
		for _, b := range tab.Pools() {
			if m, err := b.Pick(testIP, nil, nil); err == nil {
				m.Done(Success)
			}
		}
	})
}
