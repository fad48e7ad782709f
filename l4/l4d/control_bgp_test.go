package l4d

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/tiergate/tiergate/control/agent"
	"github.com/tiergate/tiergate/control/model"
	"github.com/tiergate/tiergate/control/store"
	"github.com/tiergate/tiergate/internal/config"
	"github.com/tiergate/tiergate/l4/bgp"
)

// TestControlBGP: the cluster's BGP setting (l4-bgp) comes from the store. l4d's
// file gives its own part (router ID from its next hop, listen address, each peer's
// local address) and a peer nobody answers on; a controld write of l4-bgp, naming the
// router, opens the session and the VIP of the store's rule is announced to it; a
// change of AS is refused (it needs a restart) and changes nothing; the object
// deleted, the file's peer is back and the router loses the session and the route.
func TestControlBGP(t *testing.T) {
	s, ep := openControlStore(t)
	rev := putObjects(t, s, l4Pool("l7", "10.0.0.11"), l4Rule("web", "203.0.113.10", 443, "l7"))
	ldPort := freeTCPPort(t, "127.0.0.1")
	r := newBGPRouter(t, ldPort)
	deadPort := freeTCPPort(t, "127.0.0.2")
	td := startWith(t, controlConfig(ep, t.TempDir())+fmt.Sprintf(`lame_duck: 0s
bgp:
  asn: 65001
  listen_port: %d
  listen_addresses: [127.0.0.1]
  check_interval: 50ms
  withdraw_delay: 0s
  peers:
    - {address: 127.0.0.2, as: 65000, port: %d, local_address: 127.0.0.1, hold_time: 3s, connect_retry: 1s}
`, ldPort, deadPort))
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.AppliedRevision >= rev })
	if _, up := r.state(t); up {
		t.Fatal("the router has a session with the LD before the store names it")
	}

	obj := &model.L4BGP{Name: "cluster", ASN: 65001, Peers: []bgp.PeerConfig{{
		Address: netip.MustParseAddr("127.0.0.2"), AS: 65000, Port: uint16(r.port),
		HoldTime: config.Duration(3 * time.Second), ConnectRetry: config.Duration(time.Second)}}}
	rev = putObjects(t, s, obj)
	waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.AppliedRevision >= rev })
	r.waitRoute(t, "198.18.0.2", td)
	td.want("GET", "/bgp", "", 200, `"asn": 65001`, `"address": "127.0.0.2"`, `"state": "established"`, `"announced": true`)

	// Another AS needs a restart: refused, the session and the route stay.
	other := *obj
	other.ASN = 65002
	bad := putObjects(t, s, &other)
	st := waitStatus(t, s, "l4-a", func(st agent.Status) bool { return st.RefusedRevision == bad })
	if !strings.Contains(st.Error, "l4-bgp/cluster.asn: 65002") || !strings.Contains(st.Error, "restart") {
		t.Errorf("status after a change of AS: %+v", st)
	}
	r.waitRoute(t, "198.18.0.2", td)

	// Deleted: the file's peer again, nobody there; the router loses the session.
	if _, err := s.Commit(context.Background(), store.ChangeSet{Changes: []store.Change{{Kind: model.KindL4BGP, Name: "cluster", Delete: true, IfRevision: store.Any}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		nh, up := r.state(t)
		if nh == "" && !up {
			break
		}
		if time.Now().After(deadline) {
			_, body := td.do("GET", "/bgp", "")
			t.Fatalf("the l4-bgp object deleted, the router still has the VIP via %q (session up %v); GET /bgp:\n%s", nh, up, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	td.want("GET", "/bgp", "", 200, `"address": "127.0.0.2"`)
}
