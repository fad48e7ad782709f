package route

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"github.com/tiergate/tiergate/internal/config"
)

// Config is the routing policy of an l7d node: the virtual hosts and routes of each
// listener, and the backend pools routes proxy to. Every optional field's zero value
// means the default given in its comment. The zero Config is valid and routes
// nothing.
type Config struct {
	// Listeners are the listeners whose requests are routed, by the name l7d gives
	// them. A listener not listed here matches no route.
	Listeners []Listener `yaml:"listeners,omitempty" json:"listeners,omitempty"`

	// Pools are the backend pools routes proxy to. Names must be unique.
	Pools []Pool `yaml:"pools,omitempty" json:"pools,omitempty"`
}

// Listener is the routing of one l7d listener.
type Listener struct {
	// Name is the l7d listener's name. Required, unique.
	Name string `yaml:"name" json:"name"`

	// VHosts are the virtual hosts served on the listener. A host name may appear in
	// one virtual host only.
	VHosts []VHost `yaml:"vhosts,omitempty" json:"vhosts,omitempty"`

	// PathMode is what becomes of a request whose path, as sent, is ambiguous: a
	// backend may resolve it to another path than routes were matched on (a dot
	// segment in any encoding or with a path parameter, "..;"; a backslash or %5C;
	// %2F; "//"; a stray '%'; %00; double encoding; see CheckPath). "reject" answers
	// 400. "forward_normalized" routes the request on the path's one reading and
	// sends that to the backend (NormalizePath), answering 400 only what has none
	// (%00, double encoding, "..."). "forward_raw" routes on the path as decoded and
	// resolved and sends the backend the path as sent, as before: only for backends
	// that need such spellings and resolve none of them. Paths that are not
	// ambiguous, and every query string, reach the backend as sent in every mode.
	// Counted in tiergate_route_ambiguous_paths_total. Default "reject".
	PathMode string `yaml:"path_mode,omitempty" json:"path_mode,omitempty"`

	// StrictSNI answers 421 Misdirected Request to a request whose host (Host, or an
	// absolute target's authority, without its port, in any case) is not the TLS
	// server name its connection was made for, on HTTP/1.1, HTTP/2 and HTTP/3
	// alike; a connection made with no server name (SNI), as clients do for an IP
	// address, has every request refused. A client that reused a connection for
	// another name of the same certificate (HTTP/2 and HTTP/3 connection coalescing)
	// retries it on a new one. Counted in tiergate_route_misdirected_total. Default
	// false: the virtual host is chosen by Host alone, whatever the TLS server name.
	StrictSNI bool `yaml:"strict_sni,omitempty" json:"strict_sni,omitempty"`
}

// VHost is a virtual host: the routes of requests for a set of host names.
type VHost struct {
	// Names are the host names served, matched case-insensitively against the
	// request's Host without its port: "example.com" exactly; "*.example.com" any
	// name ending in ".example.com" (one label or more; the longest such suffix
	// wins); "*" every host no other name matches (one per listener). Required.
	Names []string `yaml:"names" json:"names"`

	// Routes are tried in order; the first that matches takes the request. A request
	// no route matches is answered 404 by the caller.
	Routes []Route `yaml:"routes,omitempty" json:"routes,omitempty"`
}

// Route is a match and what to do with the requests it takes.
type Route struct {
	// Name identifies the route in metrics and logs, and keeps its rate limiter's
	// state across reloads. Unique within a listener. Default "vhosts[i].routes[j]".
	Name string `yaml:"name,omitempty" json:"name,omitempty"`

	// Match says which requests the route takes. The zero Match takes all.
	Match Match `yaml:"match,omitempty" json:"match,omitzero"`

	// Action says what to do with them: proxy to a pool, redirect, or respond.
	// Exactly one. Required.
	Action Action `yaml:"action" json:"action"`

	// Timeout bounds one proxied request, from the first connection attempt to the
	// whole response, retries included. Proxy routes only. Default 30s.
	Timeout Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`

	// Retries is how many other members an idempotent request (GET, HEAD, OPTIONS,
	// TRACE, PUT, DELETE) is tried on after a member could not be connected to.
	// Proxy routes only. From 0 to 10. Default 0: no retry.
	Retries int `yaml:"retries,omitempty" json:"retries,omitempty"`

	// RequestHeaders are edits made to the request before it is proxied.
	RequestHeaders HeaderEdits `yaml:"request_headers,omitempty" json:"request_headers,omitzero"`

	// ResponseHeaders are edits made to the response, whatever the action.
	ResponseHeaders HeaderEdits `yaml:"response_headers,omitempty" json:"response_headers,omitzero"`

	// RateLimit, when set, limits the requests each client IP may make on this
	// route; the ones over the limit are answered 429. Default none.
	RateLimit *RateLimit `yaml:"rate_limit,omitempty" json:"rate_limit,omitempty"`
}

// Match is the condition a request must meet for a route to take it. At most one of
// Path, PathPrefix and PathRegex; none matches every path. Every condition given
// must hold.
type Match struct {
	// Path matches this path exactly (case-sensitive, query excluded).
	Path string `yaml:"path,omitempty" json:"path,omitempty"`

	// PathPrefix matches paths that start with this string: "/api" takes "/api",
	// "/api/x" and "/apix"; end it with "/" to take only what is under a directory.
	PathPrefix string `yaml:"path_prefix,omitempty" json:"path_prefix,omitempty"`

	// PathRegex matches paths the regular expression (RE2 syntax) matches whole:
	// it is anchored at both ends.
	PathRegex string `yaml:"path_regex,omitempty" json:"path_regex,omitempty"`

	// Methods, when not empty, are the request methods taken ("GET", "POST", …);
	// methods are case-sensitive and written in upper case.
	Methods []string `yaml:"methods,omitempty" json:"methods,omitempty"`

	// Headers are conditions on request headers; all must hold.
	Headers []HeaderMatch `yaml:"headers,omitempty" json:"headers,omitempty"`
}

// HeaderMatch is a condition on a request header; when the header is repeated, its
// first value is tested. Exactly one of Exact, Regex and Present.
type HeaderMatch struct {
	// Name is the header's name, case-insensitive. Required.
	Name string `yaml:"name" json:"name"`

	// Exact holds when the value is this string.
	Exact string `yaml:"exact,omitempty" json:"exact,omitempty"`

	// Regex holds when the regular expression (RE2) matches the whole value.
	Regex string `yaml:"regex,omitempty" json:"regex,omitempty"`

	// Present holds when the header is in the request, whatever its value.
	Present bool `yaml:"present,omitempty" json:"present,omitempty"`

	// Invert negates the condition: with Present, the header must be absent.
	Invert bool `yaml:"invert,omitempty" json:"invert,omitempty"`
}

// Action is what a route does with a request: exactly one of Pool, Redirect and
// Respond.
type Action struct {
	// Pool proxies the request to this pool (a name in Config.Pools).
	Pool string `yaml:"pool,omitempty" json:"pool,omitempty"`

	// Redirect answers with a redirection.
	Redirect *Redirect `yaml:"redirect,omitempty" json:"redirect,omitempty"`

	// Respond answers with a fixed response.
	Respond *Respond `yaml:"respond,omitempty" json:"respond,omitempty"`
}

// Redirect is a redirection: either URL, or the parts of the request's URL to
// replace (the others are kept).
type Redirect struct {
	// Code is the status: 301, 302, 303, 307 or 308. Default 302.
	Code int `yaml:"code,omitempty" json:"code,omitempty"`

	// URL is the absolute http or https URL to redirect to, as is. Excludes the
	// fields below.
	URL string `yaml:"url,omitempty" json:"url,omitempty"`

	// Scheme replaces the scheme: "http" or "https".
	Scheme string `yaml:"scheme,omitempty" json:"scheme,omitempty"`

	// Host replaces the host, and its port if it has one ("example.net",
	// "example.net:8443").
	Host string `yaml:"host,omitempty" json:"host,omitempty"`

	// Path replaces the path; it starts with "/".
	Path string `yaml:"path,omitempty" json:"path,omitempty"`

	// StripQuery drops the request's query string. Default false: it is kept.
	StripQuery bool `yaml:"strip_query,omitempty" json:"strip_query,omitempty"`
}

// Respond is a fixed response.
type Respond struct {
	// Status is the status code, from 200 to 599. Required.
	Status int `yaml:"status" json:"status"`

	// Body is the response body, up to 64 KiB. Default empty.
	Body string `yaml:"body,omitempty" json:"body,omitempty"`

	// ContentType is the Content-Type of Body. Default "text/plain; charset=utf-8"
	// when Body is not empty.
	ContentType string `yaml:"content_type,omitempty" json:"content_type,omitempty"`
}

// HeaderEdits are changes to a message's headers, made in this order: Remove, Set,
// Add. Hop-by-hop and framing headers (Connection, Content-Length,
// Transfer-Encoding, …) cannot be edited.
type HeaderEdits struct {
	// Remove deletes every header of these names.
	Remove []string `yaml:"remove,omitempty" json:"remove,omitempty"`

	// Set replaces every header of each name with the one value given.
	Set []HeaderValue `yaml:"set,omitempty" json:"set,omitempty"`

	// Add appends a header, keeping those of the same name already there.
	Add []HeaderValue `yaml:"add,omitempty" json:"add,omitempty"`
}

// HeaderValue is a header's name and value.
type HeaderValue struct {
	Name  string `yaml:"name" json:"name"`
	Value string `yaml:"value" json:"value"`
}

// RateLimit is a token bucket per client IP: each client may make Burst requests at
// once, and PerSecond on average after that.
type RateLimit struct {
	// PerSecond is the rate tokens come back at. Required, above 0.
	PerSecond float64 `yaml:"per_second" json:"per_second"`

	// Burst is the bucket's size. Default PerSecond rounded up (at least 1).
	Burst int `yaml:"burst,omitempty" json:"burst,omitempty"`

	// IPv6PrefixLen groups IPv6 clients by this prefix, since one host often owns a
	// whole /64. From 1 to 128. Default 64.
	IPv6PrefixLen int `yaml:"ipv6_prefix_len,omitempty" json:"ipv6_prefix_len,omitempty"`

	// MaxClients bounds the clients tracked; beyond it the least recently seen is
	// forgotten (and starts again with a full bucket). Default 100000.
	MaxClients int `yaml:"max_clients,omitempty" json:"max_clients,omitempty"`
}

// Balancing policies, the values of Pool.Balance.
const (
	// RoundRobin takes members in turn, each in proportion to its weight, spread
	// evenly (smooth weighted round robin, as nginx does).
	RoundRobin = "round_robin"
	// LeastRequest takes, of two members drawn at random, the one with the fewest
	// outstanding requests for its weight.
	LeastRequest = "least_request"
	// HashClientIP sends each client IP to the same member (Maglev hashing).
	HashClientIP = "hash_client_ip"
	// HashHeader sends each value of Pool.HashHeader to the same member; requests
	// without it are hashed on the client IP.
	HashHeader = "hash_header"
)

// Pool is a set of backend servers (HTTP/1.1) that requests are proxied to.
type Pool struct {
	// Name identifies the pool in routes, metrics and logs. Required, unique.
	Name string `yaml:"name" json:"name"`

	// Members are the servers. At least one; addresses unique within the pool.
	Members []PoolMember `yaml:"members" json:"members"`

	// Balance is how a member is picked for a request: "round_robin",
	// "least_request", "hash_client_ip" or "hash_header". Default "round_robin".
	Balance string `yaml:"balance,omitempty" json:"balance,omitempty"`

	// HashHeader is the header hashed by "hash_header". Required with it only.
	HashHeader string `yaml:"hash_header,omitempty" json:"hash_header,omitempty"`

	// ConnectTimeout bounds connecting to a member; a member that cannot be reached
	// counts as a connection failure. Default 3s.
	ConnectTimeout Duration `yaml:"connect_timeout,omitempty" json:"connect_timeout,omitempty"`

	// MaxConnsPerMember bounds the connections open to each member. Default 512.
	MaxConnsPerMember int `yaml:"max_conns_per_member,omitempty" json:"max_conns_per_member,omitempty"`

	// HealthCheck, when set, probes every member on an interval and takes the ones
	// that fail out of rotation until they pass again. Default none: members are up.
	HealthCheck *HealthCheck `yaml:"health_check,omitempty" json:"health_check,omitempty"`

	// PassiveEjection, when set, takes a member out of rotation for a while after
	// requests to it fail several times in a row. Default none.
	PassiveEjection *Ejection `yaml:"passive_ejection,omitempty" json:"passive_ejection,omitempty"`
}

// PoolMember is a backend server of a pool.
type PoolMember struct {
	// Addr is "host:port". Required.
	Addr string `yaml:"addr" json:"addr"`

	// Weight is the member's share of requests relative to the others (round robin,
	// least request, hashing), from 1 to 1000. Default 1.
	Weight int `yaml:"weight,omitempty" json:"weight,omitempty"`
}

// Health check types, the values of HealthCheck.Type.
const (
	CheckHTTP = "http"
	CheckTCP  = "tcp"
)

// HealthCheck is an active health check of every member of a pool. Members start up;
// one that fails UnhealthyThreshold checks in a row goes down, and one that is down
// comes back after HealthyThreshold successes in a row.
type HealthCheck struct {
	// Type is "http" (a GET that must answer an expected status) or "tcp" (a
	// connection that must be accepted). Default "http".
	Type string `yaml:"type,omitempty" json:"type,omitempty"`

	// Path is the path of the HTTP check's GET. Default "/".
	Path string `yaml:"path,omitempty" json:"path,omitempty"`

	// Host is the Host header of the HTTP check. Default the member's address.
	Host string `yaml:"host,omitempty" json:"host,omitempty"`

	// ExpectStatus are the statuses that pass the HTTP check. Default any 2xx.
	ExpectStatus []int `yaml:"expect_status,omitempty" json:"expect_status,omitempty"`

	// Interval is the time between the starts of two checks of a member. At least
	// 10ms. Default 5s.
	Interval Duration `yaml:"interval,omitempty" json:"interval,omitempty"`

	// Timeout bounds one check; no more than Interval. Default 2s, or Interval if
	// shorter.
	Timeout Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`

	// HealthyThreshold is the successes in a row that bring a member back. From 1
	// to 100. Default 2.
	HealthyThreshold int `yaml:"healthy_threshold,omitempty" json:"healthy_threshold,omitempty"`

	// UnhealthyThreshold is the failures in a row that take a member down. From 1
	// to 100. Default 3.
	UnhealthyThreshold int `yaml:"unhealthy_threshold,omitempty" json:"unhealthy_threshold,omitempty"`
}

// Ejection is passive health checking: outcomes of real requests, reported with
// Member.Done, take a failing member out of rotation for EjectionTime.
type Ejection struct {
	// ConsecutiveFailures is the failures in a row that eject a member. From 1 to
	// 1000. Default 5.
	ConsecutiveFailures int `yaml:"consecutive_failures,omitempty" json:"consecutive_failures,omitempty"`

	// ConnectFailuresOnly counts connection failures only; otherwise every
	// failure reported (ConnectFailure and Failure: timeouts, 5xx answers) counts.
	// Default false.
	ConnectFailuresOnly bool `yaml:"connect_failures_only,omitempty" json:"connect_failures_only,omitempty"`

	// EjectionTime is how long an ejected member stays out. Default 30s.
	EjectionTime Duration `yaml:"ejection_time,omitempty" json:"ejection_time,omitempty"`

	// MaxEjectedPercent bounds the share of the pool's members ejected at once,
	// from 1 to 100; one member may always be ejected. Default 50.
	MaxEjectedPercent int `yaml:"max_ejected_percent,omitempty" json:"max_ejected_percent,omitempty"`
}

// Duration is a time.Duration written as text ("1.5s", "300ms") in YAML and JSON.
type Duration = config.Duration

// Parse decodes a Config from YAML or JSON (JSON being YAML), rejecting fields the
// model does not have, and validates it.
func Parse(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decoding routing config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}
