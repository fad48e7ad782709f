package dpdk

import (
	"errors"
	"syscall"
	"testing"
)

func TestErrno(t *testing.T) {
	for _, tc := range []struct {
		e     Errno
		text  string
		is    error
		notIs error
	}{
		{Errno(syscall.ENODEV), "no such device", syscall.ENODEV, syscall.EINVAL},
		{Errno(syscall.EEXIST), "file exists", syscall.EEXIST, ErrClosed},
		{errSecondary, "Invalid call in secondary process", nil, syscall.EINVAL},
		{errNoConfig, "Missing rte_config structure", nil, syscall.EINVAL},
	} {
		t.Run(tc.text, func(t *testing.T) {
			if tc.e.Error() != tc.text {
				t.Fatalf("Error() = %q, want %q", tc.e.Error(), tc.text)
			}
			err := error(tc.e)
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("%v is not %v", err, tc.is)
			}
			if errors.Is(err, tc.notIs) {
				t.Fatalf("%v is %v", err, tc.notIs)
			}
		})
	}
}
