// Package promreg registers Prometheus collectors so that several instances of a
// component (two keyserver clients, a certificate store per listener) can share one
// registry: the second registration of an identical collector returns the first.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c with reg, or returns the identical collector registered before.
// Any other registration error is returned with c.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, err
}
