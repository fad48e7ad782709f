package policy

import (
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tiergate/tiergate/policy/blacklist"
	"github.com/tiergate/tiergate/policy/clientip"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func mustSet(t *testing.T, text string) *blacklist.Set {
	t.Helper()
	s, err := blacklist.ParseText(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// headers returns a Request.Header over a map of one value per name, matching names
// in any case as fasthttp does.
func headers(m map[string]string) func(string) [][]byte {
	return func(name string) [][]byte {
		for k, v := range m {
			if strings.EqualFold(k, name) {
				return [][]byte{[]byte(v)}
			}
		}
		return nil
	}
}

func TestDecide(t *testing.T) {
	listeners := []Listener{
		{Name: "cdn", ClientIP: clientip.Config{TrustedProxies: []string{"192.0.2.0/24"}}},
		{Name: "lb", ClientIP: clientip.Config{ProxyProtocol: true, ProxyTrusted: []string{"10.0.0.1"},
			TrustedProxies: []string{"198.18.0.0/15"}, Header: "X-Real-IP"}},
		{Name: "plain"},
	}
	reg := prometheus.NewRegistry()
	lists := blacklist.NewLists(blacklist.Options{Registerer: reg})
	lists.Global().Replace(mustSet(t, "203.0.113.66\n198.51.100.0/24\n"))
	lists.Listener("cdn").Replace(mustSet(t, "203.0.113.77\n"))
	pol, err := New(listeners, lists, map[string]blacklist.ListConfig{"cdn": {Action: blacklist.ActionClose}}, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name     string
		listener string
		remote   string
		source   clientip.Source
		headers  map[string]string
		want     Decision
		hit      string // list:source counted
	}{
		{name: "plain peer", listener: "plain", remote: "203.0.113.1:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.66"},
			want:    Decision{ClientIP: a("203.0.113.1")}},
		{name: "untrusted peer's XFF ignored", listener: "cdn", remote: "203.0.113.2:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.66"},
			want:    Decision{ClientIP: a("203.0.113.2")}},
		{name: "trusted peer: rightmost untrusted", listener: "cdn", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.66, 203.0.113.9, 192.0.2.7"},
			want:    Decision{ClientIP: a("203.0.113.9"), ClientSource: clientip.SourceHeader, TrustedPeer: true}},
		{name: "trusted peer, blacklisted client: forbid", listener: "cdn", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "198.51.100.4"},
			want:    Decision{ClientIP: a("198.51.100.4"), ClientSource: clientip.SourceHeader, TrustedPeer: true, Status: 403}, hit: "global:header"},
		{name: "listener list with action close", listener: "cdn", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.77"},
			want:    Decision{ClientIP: a("203.0.113.77"), ClientSource: clientip.SourceHeader, TrustedPeer: true, Drop: true}, hit: "cdn:header"},
		{name: "another listener's list does not apply", listener: "plain", remote: "203.0.113.77:1",
			want: Decision{ClientIP: a("203.0.113.77")}},
		{name: "blacklisted peer on a kept-alive connection", listener: "plain", remote: "203.0.113.66:1",
			want: Decision{ClientIP: a("203.0.113.66"), Status: 403}, hit: "global:packet"},
		{name: "PROXY source, untrusted for headers", listener: "lb", remote: "203.0.113.3:1", source: clientip.SourceProxy,
			headers: map[string]string{"X-Real-IP": "203.0.113.66"},
			want:    Decision{ClientIP: a("203.0.113.3"), ClientSource: clientip.SourceProxy}},
		{name: "PROXY source trusted, single-value header", listener: "lb", remote: "198.18.0.9:1", source: clientip.SourceProxy,
			headers: map[string]string{"X-Real-IP": "203.0.113.10"},
			want:    Decision{ClientIP: a("203.0.113.10"), ClientSource: clientip.SourceHeader, TrustedPeer: true}},
		{name: "blacklisted PROXY source counts as packet", listener: "lb", remote: "198.51.100.9:1", source: clientip.SourceProxy,
			want: Decision{ClientIP: a("198.51.100.9"), ClientSource: clientip.SourceProxy, Status: 403}, hit: "global:packet"},
		{name: "unknown listener trusts nothing", listener: "other", remote: "192.0.2.5:1",
			headers: map[string]string{"X-Forwarded-For": "203.0.113.9"},
			want:    Decision{ClientIP: a("192.0.2.5")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(hitsVec(t, reg))
			got := pol.Decide(Request{Listener: tc.listener, Remote: ap(tc.remote), Source: tc.source, Header: headers(tc.headers)})
			if got != tc.want {
				t.Errorf("Decide = %+v, want %+v", got, tc.want)
			}
			after := testutil.ToFloat64(hitsVec(t, reg))
			switch {
			case tc.hit == "" && after != before:
				t.Errorf("a hit was counted")
			case tc.hit != "":
				list, source, _ := strings.Cut(tc.hit, ":")
				if after != before+1 || lists.Listener(list).Hits(source) == 0 {
					t.Errorf("hit %s not counted", tc.hit)
				}
			}
		})
	}
	if got := pol.Decide(Request{Listener: "plain", Remote: ap("203.0.113.1:1")}); got.ClientIP != a("203.0.113.1") {
		t.Errorf("a request with no header function: %+v", got)
	}

	if !pol.Accept("plain", ap("203.0.113.1:5")) || pol.Accept("plain", ap("198.51.100.1:5")) || pol.Accept("cdn", ap("203.0.113.77:5")) {
		t.Errorf("Accept does not follow the lists")
	}
	if pol.Resolver("lb") == nil || pol.Resolver("other") != nil {
		t.Errorf("Resolver: a listener's resolver, nil for no listener")
	}
	if _, err := New([]Listener{{Name: "bad", ClientIP: clientip.Config{TrustedProxies: []string{"nonsense"}}}}, lists, nil, nil); err == nil ||
		!strings.Contains(err.Error(), `listener "bad": client_ip.`) {
		t.Errorf("bad client_ip rules: %v", err)
	}
}

// hitsVec sums tiergate_blacklist_hits_total.
func hitsVec(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() == "tiergate_blacklist_hits_total" {
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("sum", "", nil, nil), prometheus.CounterValue, sum)
	})
}
