package dpdk

import (
	"errors"
	"testing"
)

func TestAFPacketInterface(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"net_af_packet0,iface=eth1", "eth1"},
		{"net_af_packet12,qpairs=2,iface=x0,blocksz=4096", "x0"},
		{"eth_af_packet0,iface=eth2", "eth2"},
		{"net_af_packet0", ""},
		{"net_ring0", ""},
		{"net_null0,iface=eth1", ""},
		{"0000:3b:00.0", ""},
		{"", ""},
	} {
		if got := AFPacketInterface(tc.in); got != tc.want {
			t.Errorf("AFPacketInterface(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCheckEALArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		bad  bool
	}{
		{"none", nil, false},
		{"one per interface", []string{"--vdev=net_af_packet0,iface=x0,qpairs=2", "--vdev=net_af_packet1,iface=i0"}, false},
		{"other drivers", []string{"--vdev=net_ring0", "--vdev=net_null0", "--vdev", "net_ring1"}, false},
		{"same interface", []string{"--vdev=net_af_packet0,iface=x0", "--vdev=net_af_packet1,iface=x0"}, true},
		{"same interface, separate form", []string{"--no-pci", "--vdev", "net_af_packet0,iface=x0", "--vdev=net_af_packet1,qpairs=2,iface=x0"}, true},
		{"trailing --vdev", []string{"--vdev=net_af_packet0,iface=x0", "--vdev"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckEALArgs(tc.args)
			if tc.bad != errors.Is(err, ErrSharedInterface) {
				t.Fatalf("CheckEALArgs(%q) = %v, want shared-interface error %v", tc.args, err, tc.bad)
			}
		})
	}
}
