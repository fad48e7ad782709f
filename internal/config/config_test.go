package config

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

type sample struct {
	Timeout Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	Name    string   `yaml:"name,omitempty" json:"name,omitempty"`
}

func TestDurationYAMLAndJSON(t *testing.T) {
	var s sample
	if err := Decode([]byte("timeout: 1.5s\nname: a\n"), "sample", &s); err != nil {
		t.Fatal(err)
	}
	if s.Timeout.D() != 1500*time.Millisecond || s.Name != "a" {
		t.Fatalf("decoded %+v", s)
	}
	var j sample
	if err := Decode([]byte(`{"timeout": "300ms"}`), "sample", &j); err != nil {
		t.Fatal(err)
	}
	if j.Timeout.D() != 300*time.Millisecond {
		t.Fatalf("decoded JSON %+v", j)
	}
	out, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"timeout":"1.5s","name":"a"}` {
		t.Fatalf("JSON %s", out)
	}
	var back sample
	if err := json.Unmarshal(out, &back); err != nil || back != s {
		t.Fatalf("round trip %+v, %v", back, err)
	}
	if err := Decode([]byte("timeout: 5x\n"), "sample", &s); err == nil || !strings.Contains(err.Error(), "decoding sample") {
		t.Fatalf("bad duration: %v", err)
	}
	if err := Decode([]byte("timout: 5s\n"), "sample", &s); err == nil || !strings.Contains(err.Error(), "field timout not found") {
		t.Fatalf("unknown field: %v", err)
	}
	if err := Decode(nil, "sample", &s); err != nil {
		t.Fatalf("empty document: %v", err)
	}
}

func TestCheckerPaths(t *testing.T) {
	var sub Checker
	sub.Addf(Index("members", 2), "required")
	sub.Add(At("health", "timeout"), errors.New("too long"))
	var c Checker
	if c.Err() != nil {
		t.Fatal("empty checker has an error")
	}
	c.Addf("name", "required")
	c.Nest(At("pools", "l7"), sub.Err())
	c.Nest("tls", errors.New("no certificate"))
	c.Nest("unused", nil)
	want := "name: required\npools.l7.members[2]: required\npools.l7.health.timeout: too long\ntls: no certificate"
	if got := c.Err().Error(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	var fe *FieldError
	if !errors.As(c.Err(), &fe) || fe.Path != "name" {
		t.Fatalf("errors.As: %v", fe)
	}
	if At("", "x") != "x" || At("x", "") != "x" {
		t.Fatal("At with an empty side")
	}
}

type located struct {
	Rules []struct {
		VIP     netip.Addr `yaml:"vip" json:"vip"`
		Timeout Duration   `yaml:"timeout" json:"timeout"`
	} `yaml:"rules" json:"rules"`
	Pools  map[string]struct{ Addr netip.Prefix } `yaml:"pools"`
	Inline `yaml:",inline"`
	Hidden netip.Addr `yaml:"-"`
}

type Inline struct {
	Gateway *netip.Addr `yaml:"gateway"`
}

func TestLocate(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"rules:\n  - {vip: 192.0.2.1}\n  - {vip: www}\n", `rules[1].vip: line 3: "www": ParseAddr("www"): unable to parse IP`},
		{"rules: [{timeout: 5x}]\n", `rules[0].timeout: line 1: "5x": time: unknown unit "x" in duration "5x"`},
		{"pools:\n  web:\n    addr: 192.0.2.1\n", `pools.web.addr: line 3: "192.0.2.1": netip.ParsePrefix("192.0.2.1"): no '/'`},
		{"gateway: x\n", `gateway: line 1: "x": ParseAddr("x"): unable to parse IP`},
		{`{"rules": [{"vip": "192.0.2.1"}, {"vip": ""}, {"vip": "2001:db8::x"}]}`, `rules[2].vip: line 1: "2001:db8::x"`},
		{"rules: [{vip: 192.0.2.1}]\nhidden: x\nunknown: y\n", ""},
		{"rules: 3\n", ""},
		{"[", ""},
	} {
		var v located
		err := Decode([]byte(tc.in), "test", &v)
		got := Locate([]byte(tc.in), &v)
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%q: located %v", tc.in, got)
		case tc.want != "" && (got == nil || !strings.Contains(got.Error(), tc.want)):
			t.Errorf("%q: located %v, want %q (Decode said %v)", tc.in, got, tc.want, err)
		case tc.want != "" && err == nil:
			t.Errorf("%q: Decode accepted what Locate refuses", tc.in)
		}
		var fe *FieldError
		if got != nil && !errors.As(got, &fe) {
			t.Errorf("%q: %T is not a FieldError", tc.in, got)
		}
	}
}
