package bfd

import (
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// birdUp is a control packet as bird2 sends it once Up (captured fields: diag 0,
// state Up, multiplier 3, discriminators, 100 ms intervals, no echo).
var birdUp = mustHex("20c0031800000a2b1f3c4d5e000186a0000186a000000000")

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestDecodeBird(t *testing.T) {
	p, err := Decode(birdUp)
	if err != nil {
		t.Fatal(err)
	}
	want := Packet{State: StateUp, DetectMult: 3, MyDiscr: 0x0a2b, YourDiscr: 0x1f3c4d5e,
		DesiredMinTx: 100 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond}
	if p != want {
		t.Errorf("got %+v\nwant %+v", p, want)
	}
	if got := p.Append(nil); string(got) != string(birdUp) {
		t.Errorf("encoded again: %x\nwant %x", got, birdUp)
	}
}

func TestRoundTrip(t *testing.T) {
	for _, p := range []Packet{
		{State: StateDown, DetectMult: 3, MyDiscr: 1, DesiredMinTx: time.Second, RequiredMinRx: 300 * time.Millisecond},
		{Diag: DiagDetectExpired, State: StateInit, Poll: true, DetectMult: 5, MyDiscr: 0xffffffff, YourDiscr: 7,
			DesiredMinTx: 1500 * time.Microsecond, RequiredMinRx: 0, RequiredMinEchoRx: 50 * time.Millisecond},
		{Diag: DiagAdminDown, State: StateAdminDown, Final: true, ControlPlaneIndependent: true, Demand: true, DetectMult: 1, MyDiscr: 9},
	} {
		b := p.Append(nil)
		if len(b) != HeaderLen {
			t.Fatalf("%d bytes", len(b))
		}
		got, err := Decode(b)
		if err != nil || got != p {
			t.Errorf("%+v: decoded %+v, %v", p, got, err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := func() []byte { return append([]byte(nil), birdUp...) }
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"short", birdUp[:23], ErrShort},
		{"version 0", func() []byte { b := good(); b[0] &^= 0xe0; return b }(), ErrVersion},
		{"length below 24", func() []byte { b := good(); b[3] = 20; return b }(), ErrLength},
		{"length beyond the datagram", func() []byte { b := good(); b[3] = 40; return b }(), ErrLength},
		{"multiplier 0", func() []byte { b := good(); b[2] = 0; return b }(), ErrDetectMult},
		{"multipoint", func() []byte { b := good(); b[1] |= flagMultipnt; return b }(), ErrMultipoint},
		{"my discriminator 0", func() []byte { b := good(); copy(b[4:8], []byte{0, 0, 0, 0}); return b }(), ErrMyDiscr},
		{"Up without your discriminator", func() []byte { b := good(); copy(b[8:12], []byte{0, 0, 0, 0}); return b }(), ErrYourDiscr},
	} {
		if _, err := Decode(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Authentication: refused with its type.
	b := append(good(), 2, 24, 1, 0)
	b[1] |= flagAuth
	b[3] = 28
	var ae *AuthError
	if _, err := Decode(b); !errors.As(err, &ae) || ae.Type != 2 {
		t.Errorf("keyed MD5 section: %v", err)
	}
	// A longer datagram than the length field: the rest is ignored.
	if _, err := Decode(append(good(), 0, 0, 0)); err != nil {
		t.Errorf("trailing bytes: %v", err)
	}
}

// FuzzDecode: no input panics, and a packet Decode takes encodes to what it was
// decoded from (less trailing bytes and the reserved flag values it ignores).
func FuzzDecode(f *testing.F) {
	f.Add(birdUp)
	f.Add((&Packet{State: StateDown, DetectMult: 3, MyDiscr: 1, DesiredMinTx: time.Second}).Append(nil))
	f.Add(append(append([]byte(nil), birdUp...), 1, 5, 1, 0, 'k', 'e', 'y'))
	f.Add([]byte{0x20, 0x44, 3, 29, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 5})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Decode(p.Append(nil))
		if err != nil || again != p {
			t.Fatalf("%x decoded as %+v; encoded and decoded again %+v, %v", b, p, again, err)
		}
	})
}
