package dpdk

import (
	"errors"
	"fmt"
	"strings"
)

// ErrSharedInterface is returned when a second net_af_packet device would bind an
// interface that another one in the process already binds.
//
// DPDK's af_packet driver puts the sockets of a device into a PACKET_FANOUT group
// whose ID it derives from the process ID and the interface index, so two devices on
// one interface in one process share a group, and the kernel spreads the interface's
// frames between them by a flow hash with a per-boot random seed: each device sees an
// unpredictable part of the traffic, on some boots none of it. One device per
// interface, with several queue pairs (qpairs=N) where more than one queue is wanted,
// is the supported shape.
var ErrSharedInterface = errors.New("dpdk: interface already bound by another net_af_packet device")

// AFPacketInterface returns the interface named by a net_af_packet device's arguments
// ("net_af_packet0,iface=eth1,qpairs=2" → "eth1"), or "" for any other device.
func AFPacketInterface(devargs string) string {
	name, params, _ := strings.Cut(devargs, ",")
	if !strings.HasPrefix(name, "net_af_packet") && !strings.HasPrefix(name, "eth_af_packet") {
		return ""
	}
	for _, kv := range strings.Split(params, ",") {
		if v, ok := strings.CutPrefix(kv, "iface="); ok {
			return v
		}
	}
	return ""
}

// vdevArgs returns the device arguments of each --vdev in EAL arguments, in order
// ("--vdev=X", "--vdev X").
func vdevArgs(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if v, ok := strings.CutPrefix(a, "--vdev="); ok {
			out = append(out, v)
		} else if a == "--vdev" && i+1 < len(args) {
			out = append(out, args[i+1])
			i++
		}
	}
	return out
}

// CheckEALArgs reports an error wrapping ErrSharedInterface when EAL arguments create
// two net_af_packet devices on one interface. Init runs it; configuration checks can
// run it before there is an EAL.
func CheckEALArgs(args []string) error {
	bound := map[string]string{}
	for _, d := range vdevArgs(args) {
		if err := bindIface(bound, d); err != nil {
			return err
		}
	}
	return nil
}

// bindIface records in bound (interface → device) the interface devargs binds, if it
// is an af_packet device, or returns ErrSharedInterface if another device has it.
func bindIface(bound map[string]string, devargs string) error {
	ifc := AFPacketInterface(devargs)
	if ifc == "" {
		return nil
	}
	dev, _, _ := strings.Cut(devargs, ",")
	if other, ok := bound[ifc]; ok {
		return fmt.Errorf("%w: %s and %s both on %q (use one device with qpairs=N)", ErrSharedInterface, other, dev, ifc)
	}
	bound[ifc] = dev
	return nil
}
