package config

import (
	"encoding/json"
	"errors"
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
