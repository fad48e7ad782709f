package route

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// validConfig exercises every part of the model.
func validConfig() *Config {
	return &Config{
		Pools: []Pool{
			{
				Name:    "web",
				Members: []PoolMember{{Addr: "192.0.2.10:8080", Weight: 3}, {Addr: "192.0.2.11:8080"}},
				HealthCheck: &HealthCheck{
					Path: "/healthz", ExpectStatus: []int{200, 204},
					Interval: Duration(time.Second), Timeout: Duration(500 * time.Millisecond),
				},
				PassiveEjection: &Ejection{ConsecutiveFailures: 3, EjectionTime: Duration(10 * time.Second)},
			},
			{
				Name:       "api",
				Members:    members("backend.internal:9000", "[2001:db8::1]:9000"),
				Balance:    HashHeader,
				HashHeader: "X-User",
				HealthCheck: &HealthCheck{
					Type: CheckTCP,
				},
			},
		},
		Listeners: []Listener{{
			Name: "https",
			VHosts: []VHost{
				{
					Names: []string{"example.com", "*.example.com"},
					Routes: []Route{
						{
							Name:   "api",
							Match:  Match{PathPrefix: "/api/", Methods: []string{"GET", "POST"}, Headers: []HeaderMatch{{Name: "X-Tenant", Regex: "t-[0-9]+"}}},
							Action: Action{Pool: "api"}, Timeout: Duration(5 * time.Second), Retries: 2,
							RequestHeaders:  HeaderEdits{Set: []HeaderValue{{Name: "X-Route", Value: "api"}}, Remove: []string{"X-Internal"}},
							ResponseHeaders: HeaderEdits{Add: []HeaderValue{{Name: "Cache-Control", Value: "no-store"}}},
							RateLimit:       &RateLimit{PerSecond: 10, Burst: 20},
						},
						{Match: Match{PathRegex: "/users/[0-9]+"}, Action: Action{Pool: "web"}},
						{Match: Match{Path: "/old"}, Action: Action{Redirect: &Redirect{Code: 301, Path: "/new"}}},
						{Action: Action{Pool: "web"}},
					},
				},
				{
					Names:  []string{"*"},
					Routes: []Route{{Action: Action{Respond: &Respond{Status: 404, Body: "no such site\n"}}}},
				},
			},
		}},
	}
}

func TestValidateAcceptsValid(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if err := (&Config{}).Validate(); err != nil {
		t.Fatalf("empty config: %v", err)
	}
}

func TestValidateNamesFields(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string // each a line of the joined error, as a prefix or whole
	}{
		{
			"bad path regex",
			func(c *Config) {
				vh := &c.Listeners[0].VHosts[0]
				vh.Routes[1].Match.PathRegex = "/users/([0-9]+"
			},
			[]string{"listeners[0].vhosts[0].routes[1].match.path_regex: error parsing regexp: missing closing ): `/users/([0-9]+`"},
		},
		{
			"regex in the third vhost's second route",
			func(c *Config) {
				c.Listeners[0].VHosts = append(c.Listeners[0].VHosts, VHost{
					Names:  []string{"other.org"},
					Routes: []Route{{Action: Action{Pool: "web"}}, {Match: Match{PathRegex: "*"}, Action: Action{Pool: "web"}}},
				})
			},
			[]string{"listeners[0].vhosts[2].routes[1].match.path_regex: error parsing regexp: missing argument to repetition operator: `*`"},
		},
		{
			"two path conditions",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[2].Match.PathPrefix = "/o" },
			[]string{"listeners[0].vhosts[0].routes[2].match: path, path_prefix and path_regex exclude each other"},
		},
		{
			"unknown path mode",
			func(c *Config) { c.Listeners[0].PathMode = "normalize" },
			[]string{`listeners[0].path_mode: "normalize": want "reject" (the default), "forward_normalized" or "forward_raw"`},
		},
		{
			"relative path",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[2].Match.Path = "old" },
			[]string{`listeners[0].vhosts[0].routes[2].match.path: "old" does not begin with '/'`},
		},
		{
			"lower-case method",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[0].Match.Methods[1] = "post" },
			[]string{`listeners[0].vhosts[0].routes[0].match.methods[1]: "post": methods are case-sensitive; write "POST"`},
		},
		{
			"header condition with two tests",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[0].Match.Headers[0].Present = true },
			[]string{"listeners[0].vhosts[0].routes[0].match.headers[0]: want exactly one of exact, regex and present"},
		},
		{
			"header regex",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[0].Match.Headers[0].Regex = "[" },
			[]string{"listeners[0].vhosts[0].routes[0].match.headers[0].regex: error parsing regexp"},
		},
		{
			"unknown pool",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[3].Action.Pool = "nope" },
			[]string{`listeners[0].vhosts[0].routes[3].action.pool: no pool is named "nope"`},
		},
		{
			"two actions",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[3].Action.Respond = &Respond{Status: 200} },
			[]string{"listeners[0].vhosts[0].routes[3].action: want exactly one of pool, redirect and respond"},
		},
		{
			"no action",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[3].Action = Action{} },
			[]string{"listeners[0].vhosts[0].routes[3].action: want exactly one of pool, redirect and respond"},
		},
		{
			"redirect code and url",
			func(c *Config) {
				c.Listeners[0].VHosts[0].Routes[2].Action.Redirect = &Redirect{Code: 200, URL: "ftp://x/"}
			},
			[]string{
				"listeners[0].vhosts[0].routes[2].action.redirect.code: want 301, 302, 303, 307 or 308",
				`listeners[0].vhosts[0].routes[2].action.redirect.url: "ftp://x/" is not an absolute http or https URL`,
			},
		},
		{
			"redirect that changes nothing",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[2].Action.Redirect = &Redirect{} },
			[]string{"listeners[0].vhosts[0].routes[2].action.redirect: changes nothing"},
		},
		{
			"redirect host with a path",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[2].Action.Redirect = &Redirect{Host: "example.net/x"} },
			[]string{`listeners[0].vhosts[0].routes[2].action.redirect.host: "example.net/x"`},
		},
		{
			"respond status",
			func(c *Config) { c.Listeners[0].VHosts[1].Routes[0].Action.Respond.Status = 99 },
			[]string{"listeners[0].vhosts[1].routes[0].action.respond.status: want 200 to 599"},
		},
		{
			"timeout and retries on a fixed response",
			func(c *Config) {
				r := &c.Listeners[0].VHosts[1].Routes[0]
				r.Timeout, r.Retries = Duration(time.Second), 1
			},
			[]string{
				"listeners[0].vhosts[1].routes[0].timeout: only routes that proxy to a pool have a timeout",
				"listeners[0].vhosts[1].routes[0].retries: only routes that proxy to a pool retry",
			},
		},
		{
			"too many retries",
			func(c *Config) { c.Listeners[0].VHosts[0].Routes[0].Retries = 11 },
			[]string{"listeners[0].vhosts[0].routes[0].retries: want 0 to 10"},
		},
		{
			"framing header edited",
			func(c *Config) {
				c.Listeners[0].VHosts[0].Routes[0].RequestHeaders.Set = append(c.Listeners[0].VHosts[0].Routes[0].RequestHeaders.Set,
					HeaderValue{Name: "transfer-encoding", Value: "chunked"})
				c.Listeners[0].VHosts[0].Routes[0].ResponseHeaders.Add[0].Value = "a\r\nb"
			},
			[]string{
				"listeners[0].vhosts[0].routes[0].request_headers.set[1].name: Transfer-Encoding cannot be edited",
				"listeners[0].vhosts[0].routes[0].response_headers.add[0].value: not a valid header value",
			},
		},
		{
			"rate limit",
			func(c *Config) {
				c.Listeners[0].VHosts[0].Routes[0].RateLimit = &RateLimit{PerSecond: 0, IPv6PrefixLen: 129}
			},
			[]string{
				"listeners[0].vhosts[0].routes[0].rate_limit.per_second: want a rate above 0",
				"listeners[0].vhosts[0].routes[0].rate_limit.ipv6_prefix_len: want 1 to 128",
			},
		},
		{
			"host names",
			func(c *Config) {
				c.Listeners[0].VHosts[1].Names = []string{"*", "EXAMPLE.com", "a.*.com", "x.org:443", "-bad.org", "*"}
			},
			[]string{
				`listeners[0].vhosts[1].names[1]: "EXAMPLE.com" is already served by listeners[0].vhosts[0].names[0]`,
				`listeners[0].vhosts[1].names[2]: "a.*.com": a wildcard is "*" alone or a leading "*."`,
				`listeners[0].vhosts[1].names[3]: "x.org:443": host names carry no port`,
				`listeners[0].vhosts[1].names[4]: "-bad.org": label "-bad" begins or ends with '-'`,
				`listeners[0].vhosts[1].names[5]: "*" is already served by listeners[0].vhosts[1].names[0]`,
			},
		},
		{
			"no host names",
			func(c *Config) { c.Listeners[0].VHosts[1].Names = nil },
			[]string{`listeners[0].vhosts[1].names: at least one host name is required`},
		},
		{
			"route names",
			func(c *Config) { c.Listeners[0].VHosts[1].Routes[0].Name = "api" },
			[]string{`listeners[0].vhosts[1].routes[0].name: "api" is already the name of listeners[0].vhosts[0].routes[0]`},
		},
		{
			"listener names",
			func(c *Config) {
				c.Listeners = append(c.Listeners, Listener{Name: "https"}, Listener{})
			},
			[]string{
				`listeners[1].name: "https" is already the name of listeners[0]`,
				"listeners[2].name: required",
			},
		},
		{
			"pools",
			func(c *Config) {
				p := &c.Pools[0]
				p.Members = append(p.Members, PoolMember{Addr: "192.0.2.10:8080"}, PoolMember{Addr: "192.0.2.12"},
					PoolMember{Addr: "192.0.2.13:0"}, PoolMember{Addr: "192.0.2.14:80", Weight: 1001})
				p.Balance = "random"
				c.Pools[1].HashHeader = "bad header"
				c.Pools = append(c.Pools, Pool{Name: "web"})
			},
			[]string{
				`pools[0].members[2].addr: "192.0.2.10:8080" is already members[0]`,
				`pools[0].members[3].addr: "192.0.2.12": want host:port`,
				`pools[0].members[4].addr: "192.0.2.13:0": port is not a number from 1 to 65535`,
				`pools[0].members[5].weight: want 1 to 1000`,
				`pools[0].balance: "random": want round_robin, least_request, hash_client_ip or hash_header`,
				`pools[1].hash_header: want the header to hash, got "bad header"`,
				`pools[2].name: "web" is already the name of pools[0]`,
				`pools[2].members: at least one member is required`,
			},
		},
		{
			"hash header without hashing on it",
			func(c *Config) { c.Pools[0].HashHeader = "X-User" },
			[]string{`pools[0].hash_header: only balance "hash_header" hashes a header`},
		},
		{
			"health check",
			func(c *Config) {
				hc := c.Pools[0].HealthCheck
				hc.Path = "healthz"
				hc.ExpectStatus = []int{200, 700}
				hc.Interval = Duration(time.Millisecond)
				hc.UnhealthyThreshold = -1
				c.Pools[1].HealthCheck.Path = "/x"
			},
			[]string{
				`pools[0].health_check.path: "healthz" does not begin with '/'`,
				`pools[0].health_check.expect_status[1]: want 100 to 599`,
				`pools[0].health_check.interval: want at least 10ms`,
				`pools[0].health_check.timeout: 500ms is longer than the interval, 1ms`,
				`pools[0].health_check.unhealthy_threshold: want 1 to 100`,
				`pools[1].health_check.type: a tcp check has no path, host or expect_status`,
			},
		},
		{
			"passive ejection",
			func(c *Config) {
				c.Pools[0].PassiveEjection = &Ejection{ConsecutiveFailures: -1, EjectionTime: -1, MaxEjectedPercent: 101}
			},
			[]string{
				`pools[0].passive_ejection.consecutive_failures: want 1 to 1000`,
				`pools[0].passive_ejection.ejection_time: must not be negative`,
				`pools[0].passive_ejection.max_ejected_percent: want 1 to 100`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.change(c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("got %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for _, w := range tt.want {
				found := false
				for _, l := range lines {
					if strings.HasPrefix(l, w) {
						found = true
					}
				}
				if !found {
					t.Errorf("no problem starts with\n\t%s\ngot:\n%v", w, err)
				}
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Path == "" {
				t.Errorf("errors.As(*FieldError) = %v, %+v", errors.As(err, &fe), fe)
			}
			if _, cerr := Compile(c); cerr == nil {
				t.Error("Compile accepted it")
			}
		})
	}
}

func TestParse(t *testing.T) {
	const doc = `
pools:
  - name: web
    balance: least_request
    members:
      - {addr: "192.0.2.10:80", weight: 2}
      - addr: "192.0.2.11:80"
    health_check: {path: /healthz, interval: 2s, timeout: 500ms}
    passive_ejection: {consecutive_failures: 3, ejection_time: 1m}
listeners:
  - name: https
    vhosts:
      - names: [example.com]
        routes:
          - name: api
            match: {path_prefix: /api/, methods: [GET]}
            action: {pool: web}
            timeout: 1.5s
            rate_limit: {per_second: 5}
`
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	p := c.Pools[0]
	if p.Balance != LeastRequest || p.Members[0].Weight != 2 || p.HealthCheck.Interval.D() != 2*time.Second ||
		p.HealthCheck.Timeout.D() != 500*time.Millisecond || p.PassiveEjection.EjectionTime.D() != time.Minute {
		t.Errorf("pool = %+v", p)
	}
	r := c.Listeners[0].VHosts[0].Routes[0]
	if r.Timeout.D() != 1500*time.Millisecond || r.RateLimit.PerSecond != 5 || r.Match.PathPrefix != "/api/" {
		t.Errorf("route = %+v", r)
	}

	json := `{"pools":[{"name":"p","members":[{"addr":"192.0.2.1:80"}]}],
	"listeners":[{"name":"l","vhosts":[{"names":["*"],"routes":[{"action":{"pool":"p"},"timeout":"250ms"}]}]}]}`
	c, err = Parse([]byte(json))
	if err != nil {
		t.Fatalf("Parse JSON: %v", err)
	}
	if got := c.Listeners[0].VHosts[0].Routes[0].Timeout.D(); got != 250*time.Millisecond {
		t.Errorf("timeout = %v", got)
	}

	for _, bad := range []struct{ doc, want string }{
		{"pools: [{name: p, memberz: []}]", "field memberz not found"},
		{"listeners: [{name: l, vhosts: [{names: ['*'], routes: [{action: {pool: p}, timeout: 5}]}]}]", "missing unit"},
		{"listeners: [{name: l, vhosts: [{names: ['*'], routes: [{action: {pool: p}}]}]}]", `listeners[0].vhosts[0].routes[0].action.pool: no pool is named "p"`},
	} {
		if _, err := Parse([]byte(bad.doc)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", bad.doc, err, bad.want)
		}
	}
	if c, err := Parse(nil); err != nil || len(c.Listeners) != 0 {
		t.Errorf("Parse(empty) = %+v, %v", c, err)
	}
}

// TestConfigRoundTrip: the model survives JSON (the control plane's API) and YAML
// (files) both ways, durations as text.
func TestConfigRoundTrip(t *testing.T) {
	c := validConfig()
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"timeout":"5s"`) || !strings.Contains(string(js), `"path_regex":"/users/[0-9]+"`) {
		t.Errorf("JSON: %s", js)
	}
	var fromJSON Config
	if err := json.Unmarshal(js, &fromJSON); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&fromJSON, c) {
		t.Errorf("JSON round trip differs:\n%s", js)
	}
	ys, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := Parse(ys)
	if err != nil {
		t.Fatalf("Parse(yaml.Marshal(c)): %v\n%s", err, ys)
	}
	if !reflect.DeepEqual(fromYAML, c) {
		t.Errorf("YAML round trip differs:\n%s", ys)
	}
	var d struct{ D Duration }
	if err := json.Unmarshal([]byte(`{"D": 5}`), &d); err == nil {
		t.Error("a duration without a unit was accepted from JSON")
	}
}
