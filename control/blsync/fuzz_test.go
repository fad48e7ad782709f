package blsync

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/tiergate/tiergate/policy/blacklist"
)

// FuzzDecodeManifest: any bytes decode to a manifest that holds together, or an
// error; never a panic.
func FuzzDecodeManifest(f *testing.F) {
	m := Manifest{Name: "global", Version: 3, Base: Base{Version: 2, Entries: 1, Bytes: 30,
		Chunks: []ChunkRef{{SHA256: sum([]byte("x")), Entries: 1, Bytes: 30}}}, Deltas: DeltaRange{From: 3, To: 3, Bytes: 40}}
	data, _ := jsonMarshal(&m)
	f.Add(data)
	f.Add([]byte(`{"name":"global","version":0,"base":{"version":0,"chunks":[]},"deltas":{}}`))
	f.Add([]byte(`{"name":"global","version":5,"base":{"version":9}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeManifest("global", data)
		if err != nil {
			return
		}
		if m.Name != "global" || m.Base.Version > m.Version || len(m.Base.Chunks) > MaxChunks {
			t.Fatalf("accepted %+v", m)
		}
		if m.Deltas.Count() != 0 && m.Deltas.To != m.Version {
			t.Fatalf("accepted deltas %+v of version %d", m.Deltas, m.Version)
		}
	})
}

// FuzzDecodeDelta: a stored delta decodes to valid prefixes, or an error.
func FuzzDecodeDelta(f *testing.F) {
	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("198.51.100.7/32"), Expires: time.Unix(2000000000, 0)}},
		Remove: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}
	data, _ := encodeDelta(4, d, Meta{Who: "risk", Reasons: []string{"scan"}}, time.Unix(1700000000, 0))
	f.Add(int64(4), data)
	f.Add(int64(1), []byte(`{"version":1,"add":[{"p":"::ffff:1.2.3.4"}],"remove":["1.2.3.4/33"]}`))
	f.Add(int64(1), []byte(`{"version":1,"add":[{"p":"fe80::1%eth0","x":-1}]}`))
	f.Fuzz(func(t *testing.T, v int64, data []byte) {
		d, rec, err := DecodeDelta(v, data)
		if err != nil {
			return
		}
		if rec.Version != v {
			t.Fatalf("version %d for %d", rec.Version, v)
		}
		for _, e := range d.Add {
			if !e.Prefix.IsValid() {
				t.Fatalf("invalid prefix accepted: %v", e)
			}
		}
		for _, p := range d.Remove {
			if !p.IsValid() {
				t.Fatalf("invalid prefix accepted: %v", p)
			}
		}
		l := blacklist.NewList("x", blacklist.Options{})
		if err := l.Apply(d); err != nil {
			t.Fatalf("a decoded delta does not apply: %v", err)
		}
	})
}

// FuzzDecodeChunk: a chunk is refused unless its bytes are its reference's, and
// then decodes or is refused as corrupt.
func FuzzDecodeChunk(f *testing.F) {
	cs, _ := encodeChunks(randomSet(9, 200))
	f.Add(cs[0].data, true)
	f.Add(cs[0].data, false)
	f.Add([]byte("\x89TGBL\r\n\x1a\x00\x01\x00\x00"), true)
	f.Fuzz(func(t *testing.T, data []byte, matching bool) {
		ref := ChunkRef{SHA256: sum(data), Bytes: len(data)}
		if !matching {
			ref.SHA256 = sum(append(bytes.Clone(data), 0))
		}
		s, err := decodeChunk(ref, data)
		if !matching && err == nil {
			t.Fatal("a chunk not matching its hash was accepted")
		}
		if err == nil && s == nil {
			t.Fatal("no set and no error")
		}
	})
}

// FuzzDeltaFast: the fast reading of a stored delta accepts only what
// encoding/json accepts, and reads it the same.
func FuzzDeltaFast(f *testing.F) {
	d := &blacklist.Delta{Add: []blacklist.Entry{{Prefix: netip.MustParsePrefix("198.51.100.7/32"), Expires: time.Unix(2000000000, 0)},
		{Prefix: netip.MustParsePrefix("2001:db8::/48")}}, Remove: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	data, _ := encodeDelta(4, d, Meta{Who: "risk", Reasons: []string{"scan"}}, time.Unix(1700000000, 5))
	f.Add(data)
	for _, s := range []string{
		`{"version":1,"time":"2026-01-02T03:04:05Z","add":[{"p":"1.2.3.4","x":0,"r":""}],"remove":[]}`,
		`{ "version" : -0 , "add" : [ ] , "remove" : [ "::1" ] }`, `{"version":01}`, `{"version":1e3}`, `{"version":1.0}`,
		`{"version":9223372036854775808}`, `{"version":1,"version":2}`, `{"Version":1}`, `{"version":1,"add":null}`,
		`{"version":1,"add":[{"p":"a\"b"}]}`, `{"version":1,"add":[{"p":"1.2.3.4","p":"1.2.3.5"}]}`, `{"version":1,"add":[{"x":"1"}]}`,
		`{"version":1,"time":"yesterday"}`, `{"version":1,"who":"é"}`, `{"version":1} x`, `{"version":1,}`, `{"version":1,"add":[1]}`,
		`{"version":1,"remove":["1.2.3.4",]}`, `{}`, `{"version":1,"extra":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast, slow DeltaRecord
		if !deltaFast(b, &fast) {
			return
		}
		if err := json.Unmarshal(b, &slow); err != nil {
			t.Fatalf("%q: read fast, refused by encoding/json: %v", b, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("%q: fast %+v, encoding/json %+v", b, fast, slow)
		}
	})
}

// TestDeltaFastReadsTheWriters: what encodeDelta writes is read by the fast
// path, the same as encoding/json reads it; a reason json.Marshal escapes is
// left to encoding/json, which DecodeDelta then uses.
func TestDeltaFastReadsTheWriters(t *testing.T) {
	var d blacklist.Delta
	for i := range 1000 {
		e := blacklist.Entry{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 32)}
		if i%3 == 0 {
			e.Expires = time.Unix(1900000000+int64(i), 0)
		}
		d.Add = append(d.Add, e)
	}
	d.Remove = []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}
	for _, c := range []struct {
		reasons []string
		fast    bool
	}{{[]string{"crowdsecurity/ssh-bf", "scan"}, true}, {[]string{"ssh-bf", "scan <x> & \"q\""}, false}} {
		data, err := encodeDelta(7, &d, Meta{Who: "crowdsec", Reasons: c.reasons}, time.Unix(1700000000, 123))
		if err != nil {
			t.Fatal(err)
		}
		var fast, slow DeltaRecord
		if got := deltaFast(data, &fast); got != c.fast {
			t.Fatalf("reasons %q: read by the fast path %v, want %v:\n%.300s", c.reasons, got, c.fast, data)
		}
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatal(err)
		}
		if c.fast && !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast %+v\nencoding/json %+v", fast.Add[:2], slow.Add[:2])
		}
		got, rec, err := DecodeDelta(7, data)
		if err != nil || len(got.Add) != 1000 || len(got.Remove) != 1 || !got.Add[0].Expires.Equal(time.Unix(1900000000, 0)) ||
			!reflect.DeepEqual(*rec, slow) {
			t.Fatalf("DecodeDelta: %v", err)
		}
	}
}
