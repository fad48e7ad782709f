// Package bird runs Debian's bird2 as a test's router: a real BGP peer, not Tiergate
// code, in a network namespace of the test's (testkit/netns), with its own
// configuration file and control socket in a temporary directory. It accepts routes
// from its BGP peers and puts them in the namespace's kernel table, with ECMP
// (`merge paths on`): the routes of several peers for one prefix become one
// multipath route, as a data-centre router's would. The process is stopped when the
// test ends, and the namespace's kernel routes with it.
package bird

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/testkit/netns"
	"github.com/tiergate/tiergate/testkit/testenv"
)

// Config is the router's BGP setup.
type Config struct {
	// RouterID and Address are the router's identifier and its address on the
	// peers' network (the sessions' local address).
	RouterID, Address string
	// AS is the router's AS number.
	AS uint32
	// HoldTime is the hold time offered, in seconds. Default 3 (BGP's shortest).
	HoldTime int
	// Peers are the BGP sessions, each a protocol of its Name.
	Peers []Peer
	// BFD, when set, runs bird's BFD (`protocol bfd`) with these timers on every
	// interface, for the peers with BFD and the static routes with BFD.
	BFD *BFD
	// Static are routes of bird's own (`protocol static`), exported to the kernel
	// like the peers'.
	Static []Static
}

// BFD is the router's BFD timers (RFC 5880): it asks its peers for packets every
// MinRx, sends every MinTx once a session is up (one a second before), and takes a
// session down after Multiplier of the peer's intervals without a packet.
type BFD struct {
	MinRx, MinTx time.Duration
	Multiplier   int
}

// Static is a route of the router's own.
type Static struct {
	// Prefix is the destination ("203.0.113.10/32"), Via the next hop.
	Prefix, Via string
	// BFD keeps the route only while a BFD session with Via is up (needs
	// Config.BFD).
	BFD bool
}

// Peer is one BGP session.
type Peer struct {
	// Name is the session's name in bird (`birdc show protocols`): letters,
	// digits and underscores.
	Name string
	// Address and AS are the peer's.
	Address string
	AS      uint32
	// Password signs the session with TCP MD5 when not empty.
	Password string
	// TTLSecurity turns GTSM on (`ttl security on`).
	TTLSecurity bool
	// BFD makes the session follow a BFD session with the peer (`bfd on`): when
	// it goes down, so do the session and its routes (needs Config.BFD).
	BFD bool
}

// Router is a running bird.
type Router struct {
	ns   *netns.NS
	dir  string
	sock string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// config renders c as bird.conf.
func (c Config) config() string {
	hold := c.HoldTime
	if hold == 0 {
		hold = 3
	}
	var b strings.Builder
	fmt.Fprintf(&b, `log stderr all;
router id %s;
protocol device { scan time 1; }
protocol kernel {
	ipv4 { import none; export all; };
	merge paths on;
}
template bgp ld {
	local %s as %d;
	hold time %d;
	keepalive time 1;
	connect delay time 1;
	connect retry time 1;
	error wait time 1, 2;
	ipv4 { import all; export none; };
}
`, c.RouterID, c.Address, c.AS, hold)
	if f := c.BFD; f != nil {
		fmt.Fprintf(&b, "protocol bfd {\n\tinterface \"*\" {\n\t\tmin rx interval %d ms;\n\t\tmin tx interval %d ms;\n\t\tidle tx interval 1000 ms;\n\t\tmultiplier %d;\n\t};\n}\n",
			f.MinRx.Milliseconds(), f.MinTx.Milliseconds(), f.Multiplier)
	}
	if len(c.Static) > 0 {
		b.WriteString("protocol static {\n\tipv4;\n")
		for _, r := range c.Static {
			fmt.Fprintf(&b, "\troute %s via %s", r.Prefix, r.Via)
			if r.BFD {
				b.WriteString(" bfd")
			}
			b.WriteString(";\n")
		}
		b.WriteString("}\n")
	}
	for _, p := range c.Peers {
		fmt.Fprintf(&b, "protocol bgp %s from ld {\n\tneighbor %s as %d;\n", p.Name, p.Address, p.AS)
		if p.Password != "" {
			fmt.Fprintf(&b, "\tpassword \"%s\";\n", p.Password)
		}
		if p.TTLSecurity {
			b.WriteString("\tttl security on;\n")
		}
		if p.BFD {
			b.WriteString("\tbfd on;\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// check refuses what bird's configuration cannot carry as given: a session name
// other than letters, digits and underscores, a password with a quote, a backslash
// or a control character (bird's strings have no escapes).
func (c Config) check() error {
	if f := c.BFD; f != nil && (f.MinRx < time.Millisecond || f.MinTx < time.Millisecond || f.Multiplier < 1 || f.Multiplier > 255) {
		return fmt.Errorf("bird: BFD timers %+v: want intervals of at least 1ms and a multiplier in 1..255", *f)
	}
	for _, p := range c.Peers {
		if p.BFD && c.BFD == nil {
			return fmt.Errorf("bird: session %s has BFD and the router none (Config.BFD)", p.Name)
		}
		if p.Name == "" || strings.Trim(p.Name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" {
			return fmt.Errorf("bird: session name %q: want letters, digits and underscores", p.Name)
		}
		if strings.ContainsFunc(p.Password, func(r rune) bool { return r == '"' || r == '\\' || r < ' ' || r > '~' }) {
			return fmt.Errorf("bird: session %s: the password must be printable ASCII without quotes or backslashes", p.Name)
		}
	}
	return nil
}

// Render checks c and returns its bird.conf, for a router run outside a test
// (tgdemo's).
func (c Config) Render() (string, error) {
	if err := c.check(); err != nil {
		return "", err
	}
	return c.config(), nil
}

// Start writes c's configuration, checks it with `bird -p` and runs bird in ns
// until the test ends.
func Start(t testing.TB, ns *netns.NS, c Config) *Router {
	t.Helper()
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	testenv.RequireCommand(t, "bird", "bird2")
	testenv.RequireCommand(t, "birdc", "bird2")
	dir := t.TempDir()
	r := &Router{ns: ns, dir: dir, sock: filepath.Join(dir, "bird.ctl"), log: filepath.Join(dir, "bird.log"), done: make(chan struct{})}
	conf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(c.config()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bird", "-p", "-c", conf).CombinedOutput(); err != nil {
		t.Fatalf("bird rejects its configuration: %v: %s\n%s", err, out, c.config())
	}
	logf, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	r.cmd = ns.Command("bird", "-f", "-c", conf, "-s", r.sock, "-P", filepath.Join(dir, "bird.pid"))
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if err := r.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("starting bird in %s: %v", ns, err)
	}
	go func() {
		r.cmd.Wait()
		logf.Close()
		close(r.done)
	}()
	t.Cleanup(r.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := r.Birdc("show", "status"); err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("bird did not answer on %s within 10s\n%s", r.sock, r.LogTail())
		}
		select {
		case <-r.done:
			t.Fatalf("bird exited: %v\n%s", r.cmd.ProcessState, r.LogTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop ends bird (SIGTERM, then SIGKILL after 5 s) and waits for it.
func (r *Router) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// Birdc runs a birdc command on the router's control socket and returns its output.
func (r *Router) Birdc(args ...string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", r.sock}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Established reports whether the session named name is established.
func (r *Router) Established(name string) bool {
	out, err := r.Birdc("show", "protocols", name)
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == name {
			return slices.Contains(f, "Established")
		}
	}
	return false
}

// BFDSessions returns the state of each BFD session (Up, Down, Init, AdminDown)
// by the peer's address, from `birdc show bfd sessions`.
func (r *Router) BFDSessions() (map[string]string, error) {
	out, err := r.Birdc("show", "bfd", "sessions")
	if err != nil {
		return nil, err
	}
	return ParseBFDSessions(out), nil
}

// ParseBFDSessions reads `birdc show bfd sessions`: each session's state by the
// peer's address.
func ParseBFDSessions(out string) map[string]string {
	m := map[string]string{}
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		if _, err := netip.ParseAddr(f[0]); err == nil {
			m[f[0]] = f[2]
		}
	}
	return m
}

// NextHops returns the gateways of the kernel's route for prefix (like
// "203.0.113.10/32") in the router's namespace, sorted: one for a plain route,
// several for a multipath one, none without a route.
func (r *Router) NextHops(prefix string) ([]string, error) {
	out, err := r.ns.Run("ip", "-j", "route", "show", "exact", prefix)
	if err != nil {
		return nil, err
	}
	return ParseNextHops([]byte(out))
}

// ParseNextHops returns the gateways of `ip -j route` output, sorted: one for a
// plain route, several for a multipath one, none for no route (or no output).
func ParseNextHops(out []byte) ([]string, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return nil, nil
	}
	var routes []struct {
		Gateway  string `json:"gateway"`
		Nexthops []struct {
			Gateway string `json:"gateway"`
		} `json:"nexthops"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, fmt.Errorf("ip -j route: %w: %s", err, out)
	}
	var gws []string
	for _, rt := range routes {
		if rt.Gateway != "" {
			gws = append(gws, rt.Gateway)
		}
		for _, nh := range rt.Nexthops {
			gws = append(gws, nh.Gateway)
		}
	}
	slices.Sort(gws)
	return gws, nil
}

// Routes returns `ip route` in the router's namespace, for failure messages.
func (r *Router) Routes() string {
	out, _ := r.ns.Run("ip", "route")
	return out
}

// LogTail returns the end of bird's log.
func (r *Router) LogTail() string {
	data, _ := os.ReadFile(r.log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
