//go:build linux

package nsenter

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tiergate/tiergate/testkit/testenv"
)

func TestDoEntersAndLeaves(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommand(t, "ip", "iproute2")
	name := "tgnsenter" + strings.TrimPrefix(t.Name(), "Test")[:4]
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	self, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	if err := Do("/run/netns/"+name, func() error {
		var err error
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inside == self {
		t.Fatalf("f ran in the caller's namespace %s", self)
	}
	if err := Do("/run/netns/does-not-exist", func() error { return nil }); err == nil {
		t.Fatal("entering a missing namespace succeeded")
	}
	if after, _ := os.Readlink("/proc/self/ns/net"); after != self {
		t.Fatalf("the process moved to %s", after)
	}
}
