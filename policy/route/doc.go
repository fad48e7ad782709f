// Package route is Tiergate's HTTP routing policy: the declarative model (listeners,
// virtual hosts, ordered routes, backend pools) that l7d is configured with and the
// control plane serves, its validation, and the compiled form the request path reads
// without locks or allocations.
//
// # Model and life cycle
//
// A Config is decoded (Parse reads YAML or JSON and rejects unknown fields), checked
// by Validate, whose errors name each offending field by its path
// ("listeners[0].vhosts[2].routes[1].match.path_regex: ..."), and compiled into a
// Table: an immutable snapshot with, per listener, a host index (exact names in a map,
// "*.suffix" wildcards in a map searched longest suffix first, then the "*" default)
// leading to the virtual host's routes. Within a virtual host the first route that
// matches wins, in configuration order; the search is not linear all the same:
// routes on exact paths are found in a map; prefix routes, and regular expressions
// by the literal their matches begin with, in a map looked up once per prefix
// length in use; only the other regular expressions and path-less routes are
// scanned; each index bounds the others so that order is kept.
//
// A Router owns the runtime state that outlives any one configuration: per pool
// member the health-check status, the passive-ejection state and the outstanding
// request count, keyed by pool name and member address; and per route its rate
// limiter, keyed by listener and route name. Router.Apply validates, compiles and
// swaps the Table in one atomic store; a request holds the Table it started with to
// the end, so a reload drops nothing and nothing is ever half applied. Members and
// rate limiters that a new configuration keeps, keep their state; health checkers
// start and stop with their members.
//
// # Request path
//
// The caller (l7's handler) loads Router.Table once per request and:
//
//   - calls Table.Screen with the listener name, Host, the TLS server name and the
//     path as sent: per the listener's StrictSNI it answers 421 to a Host that is
//     not the server name, and per its PathMode it answers 400 to an ambiguous path
//     (CheckPath: dot segments in any encoding or with a path parameter, backslashes,
//     encoded slashes, "//", %00, double encoding), or gives the normalised path to
//     route and forward (NormalizePath), so that no spelling of a path reaches a
//     backend that resolves it to another path than the route matched;
//   - calls Table.Match with the listener name, Host, method, path and a header
//     lookup function (fasthttp's RequestHeader.Peek), getting the CompiledRoute,
//     or false for a 404; it allocates nothing;
//   - calls CompiledRoute.Allow with the client IP (a token bucket per route and
//     client, in bounded memory) and answers 429 when it returns false;
//   - by CompiledRoute.Kind: answers Respond, or redirects (RedirectCode,
//     AppendLocation), or applies RequestHeaders and proxies with CompiledRoute.Do,
//     which picks a member (Balancer.Pick: weighted round robin, least request or
//     Maglev consistent hashing, skipping members that are down or ejected), runs
//     one attempt on it, reports the Outcome (Member.Done) and retries on another
//     member while Retry allows;
//   - applies ResponseHeaders to the response, whatever the action.
//
// Consistent hashing uses Maglev (Eisenbud et al., NSDI 2016) rather than a ring:
// lookups are one table index, the load spread is within a few percent of the
// weights, and removing a member moves few keys that were not on it. Members that are
// down are skipped by walking the table forward from the key's slot, so keys of
// healthy members never move while another member is down. The hash is a fixed
// function (FNV-1a with a 64-bit finaliser), so every l7d node maps a client or a
// header value to the same member.
package route
