package netns

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestVethPing(t *testing.T) {
	a := New(t, "a")
	b := New(t, "b")
	if a.Name() == b.Name() || !strings.HasPrefix(a.Name(), "tg") {
		t.Fatalf("names %q and %q: want distinct, starting with tg", a.Name(), b.Name())
	}
	Veth(t, a, "va", b, "vb")
	a.Addr("va", "198.18.9.1/24")
	b.Addr("vb", "198.18.9.2/24")
	reach(t, a, b, "198.18.9.2")
	// The host namespace must not see either end.
	if _, err := net.InterfaceByName("va"); err == nil {
		t.Error("va is visible in the host namespace")
	}
}

func TestDoListensInside(t *testing.T) {
	ns := New(t, "do")
	ns.Addr("lo", "198.18.9.9/32")
	ln := ns.Listen("198.18.9.9:0")
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
	// The address exists only inside: dialling from the host must fail, from inside work.
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), 200*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("dialled a namespace's address from the host")
	}
	var got []byte
	ns.MustDo(func() error {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		got = make([]byte, 2)
		_, err = c.Read(got)
		return err
	})
	if string(got) != "hi" {
		t.Fatalf("read %q, want hi", got)
	}
	// Do restores the thread: the host's loopback has no 198.18.9.9.
	if err := ns.Do(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestBridgeAndHostEnd(t *testing.T) {
	sw := New(t, "sw")
	h1 := New(t, "h1")
	h2 := New(t, "h2")
	Veth(t, h1, "eth0", sw, "p1")
	Veth(t, h2, "eth0", sw, "p2")
	Bridge(t, sw, "br0", "p1", "p2")
	h1.Addr("eth0", "198.18.9.1/24")
	h2.Addr("eth0", "198.18.9.2/24")
	reach(t, h1, h2, "198.18.9.2")
	h1.Route("add", "192.0.2.0/24", "via", "198.18.9.2")
	if out := h1.MustRun("ip", "route", "get", "192.0.2.7"); !strings.Contains(out, "via 198.18.9.2") {
		t.Fatalf("route get: %s", out)
	}
}

func TestCleanupRemovesEverything(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		ns := New(t, "gone")
		name = ns.Name()
		cmd := ns.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		if _, err := os.Stat(ns.Path()); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Stat(runDir + "/" + name); !os.IsNotExist(err) {
		t.Fatalf("namespace %s still exists after its test: %v", name, err)
	}
}

// reach checks that from can open a TCP connection to addr, listened on in to.
func reach(t *testing.T, from, to *NS, addr string) {
	t.Helper()
	var ln net.Listener
	to.MustDo(func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(addr, "0"))
		return err
	})
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	from.MustDo(func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// TestVethHostEnd: a pair with a nil namespace has that end in the host (this
// process's namespace), not in the test namespace it was made from.
func TestVethHostEnd(t *testing.T) {
	ns := New(t, "he")
	host := fmt.Sprintf("tgh%d", os.Getpid()%100000)
	Veth(t, ns, "eth0", nil, host)
	if _, err := net.InterfaceByName(host); err != nil {
		t.Fatalf("the host end %s is not in the host: %v", host, err)
	}
	if out, err := ns.Run("ip", "link", "show", host); err == nil {
		t.Fatalf("the host end %s is in the test namespace too: %s", host, out)
	}
}
