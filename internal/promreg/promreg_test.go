package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterReusesIdentical(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "x_total", Help: "x"}
	a, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Register(reg, prometheus.NewCounter(opts))
	if err != nil || b != a {
		t.Fatalf("second registration: %v, same collector %v", err, b == a)
	}
	// Same name, different labels: a real conflict.
	if _, err := Register(reg, prometheus.NewCounterVec(opts, []string{"l"})); err == nil {
		t.Fatal("conflicting collector registered")
	}
}
