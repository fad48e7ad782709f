package certs

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	notAfterA := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	notAfterB := time.Now().Add(72 * time.Hour).Truncate(time.Second)
	a := p.files(t, dir, "a", leafSpec{cn: "a.example.com", names: []string{"a.example.com"}, key: ecKey(t), notAfter: notAfterA}, false)
	b := p.files(t, dir, "b", leafSpec{cn: "b.example.com", names: []string{"b.example.com"}, key: ecKey(t), notAfter: notAfterB}, false)
	bad := CertConfig{Name: "bad", CertFile: filepath.Join(dir, "missing.pem")}

	reg := prometheus.NewRegistry()
	s := NewStore(Options{Registerer: reg, Logger: quietLog})
	if _, err := s.Load(Config{Certificates: []CertConfig{a, b, bad}}); err != nil {
		t.Fatal(err)
	}
	want := func(certs ...string) string {
		var sb strings.Builder
		sb.WriteString("# HELP tiergate_tls_certificate_expiry_seconds When each served certificate expires (its NotAfter), as a Unix time.\n")
		sb.WriteString("# TYPE tiergate_tls_certificate_expiry_seconds gauge\n")
		for _, c := range certs {
			sb.WriteString(c + "\n")
		}
		return sb.String()
	}
	line := func(name string, notAfter time.Time) string {
		return fmt.Sprintf(`tiergate_tls_certificate_expiry_seconds{name=%q,subject="CN=%s.example.com"} %d`, name, name, notAfter.Unix())
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(line("a", notAfterA), line("b", notAfterB))),
		"tiergate_tls_certificate_expiry_seconds"); err != nil {
		t.Fatal(err)
	}
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	if n := gauge("tiergate_tls_certificates"); n != 2 {
		t.Errorf("tiergate_tls_certificates = %v, want 2", n)
	}
	if n := gauge("tiergate_tls_certificates_rejected"); n != 1 {
		t.Errorf("tiergate_tls_certificates_rejected = %v, want 1", n)
	}

	// b vanishes: its series goes.
	if _, err := s.Load(Config{Certificates: []CertConfig{a}}); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want(line("a", notAfterA))),
		"tiergate_tls_certificate_expiry_seconds"); err != nil {
		t.Fatal(err)
	}
	if n := gauge("tiergate_tls_certificates"); n != 1 {
		t.Errorf("tiergate_tls_certificates = %v, want 1", n)
	}

	// A failed load changes no gauge and counts as an error.
	if _, err := s.Load(Config{Certificates: []CertConfig{bad}}); err == nil {
		t.Fatal("load of only a bad certificate succeeded")
	}
	if n := gauge("tiergate_tls_certificates"); n != 1 {
		t.Errorf("after a failed load, tiergate_tls_certificates = %v, want 1", n)
	}
	if got := testutil.ToFloat64(s.m.loads.WithLabelValues("ok")); got != 2 {
		t.Errorf("ok loads = %v, want 2", got)
	}
	if got := testutil.ToFloat64(s.m.loads.WithLabelValues("error")); got != 1 {
		t.Errorf("failed loads = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(s.m.expiry); n != 1 {
		t.Errorf("%d expiry series, want 1", n)
	}

	// A second Store on the same registry shares the collectors instead of failing.
	NewStore(Options{Registerer: reg, Logger: quietLog})
}
