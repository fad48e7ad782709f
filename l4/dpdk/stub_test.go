//go:build !cgo || nodpdk

package dpdk

import (
	"errors"
	"testing"
)

func TestStubReportsUnavailable(t *testing.T) {
	if err := Init(nil); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Init without DPDK: %v, want ErrUnavailable", err)
	}
	if _, err := NewMempool("p", 64, 0, 0, -1); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("NewMempool: %v", err)
	}
	if _, err := OpenPort(0, "", PortConfig{}, nil); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("OpenPort: %v", err)
	}
}
