package packet

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// longHeader builds a QUIC long header: first byte, version, DCID, SCID, then rest.
func longHeader(first byte, version uint32, dcid, scid, rest []byte) []byte {
	b := []byte{first}
	b = binary.BigEndian.AppendUint32(b, version)
	b = append(b, byte(len(dcid)))
	b = append(b, dcid...)
	b = append(b, byte(len(scid)))
	b = append(b, scid...)
	return append(b, rest...)
}

func TestQUICDestConnID(t *testing.T) {
	dcid8 := []byte{0x07, 0x00, 0x2a, 1, 2, 3, 4, 5}
	scid := []byte{9, 9, 9, 9}
	body := bytes.Repeat([]byte{0x5a}, 40)
	cid20 := bytes.Repeat([]byte{0x20}, 20)
	cases := []struct {
		name     string
		u        []byte
		shortLen int
		cid      []byte
		long     bool
		typ      uint8
		ok       bool
	}{
		{"v1 initial", longHeader(0xc3, quicV1, dcid8, scid, body), 8, dcid8, true, QUICInitial, true},
		{"v1 0-rtt", longHeader(0xd0, quicV1, dcid8, scid, body), 8, dcid8, true, QUIC0RTT, true},
		{"v1 handshake", longHeader(0xe1, quicV1, dcid8, nil, body), 8, dcid8, true, QUICHandshake, true},
		{"v1 retry", longHeader(0xf0, quicV1, dcid8, scid, body), 8, dcid8, true, QUICRetry, true},
		{"v2 initial", longHeader(0xd0, quicV2, dcid8, scid, body), 8, dcid8, true, QUICInitial, true},
		{"v2 0-rtt", longHeader(0xe0, quicV2, dcid8, scid, body), 8, dcid8, true, QUIC0RTT, true},
		{"v2 handshake", longHeader(0xf0, quicV2, dcid8, scid, body), 8, dcid8, true, QUICHandshake, true},
		{"v2 retry", longHeader(0xc0, quicV2, dcid8, scid, body), 8, dcid8, true, QUICRetry, true},
		{"v1 empty dcid", longHeader(0xc0, quicV1, nil, scid, body), 8, []byte{}, true, QUICInitial, true},
		{"v1 dcid 20", longHeader(0xc0, quicV1, cid20, scid, body), 8, cid20, true, QUICInitial, true},
		{"v1 dcid 21", longHeader(0xc0, quicV1, append(cid20, 1), scid, body), 8, nil, true, QUICInitial, false},
		{"v1 scid 21", longHeader(0xc0, quicV1, dcid8, append(cid20, 1), body), 8, nil, true, QUICInitial, false},
		{"unknown version long cid", longHeader(0xc0, 0x1a2a3a4a, bytes.Repeat([]byte{1}, 30), nil, nil), 8, bytes.Repeat([]byte{1}, 30), true, 0, true},
		{"version negotiation", longHeader(0x80, 0, dcid8, scid, body), 8, nil, true, 0, false},
		{"long header no scid length", longHeader(0xc0, quicV1, dcid8, nil, nil)[:14], 8, nil, true, 0, false},
		{"long header cut in dcid", longHeader(0xc0, quicV1, dcid8, nil, nil)[:10], 8, nil, true, 0, false},
		{"long header cut in scid", longHeader(0xc0, quicV1, dcid8, scid, nil)[:17], 8, nil, true, 0, false},
		{"long header 6 bytes", longHeader(0xc0, quicV1, nil, nil, nil)[:6], 8, nil, true, 0, false},
		{"short", append([]byte{0x41}, append(dcid8, body...)...), 8, dcid8, false, 0, true},
		{"short exact", append([]byte{0x41}, dcid8...), 8, dcid8, false, 0, true},
		{"short too short", append([]byte{0x41}, dcid8[:7]...), 8, nil, false, 0, false},
		{"short len 0", []byte{0x40}, 0, []byte{}, false, 0, true},
		{"short len 21", append([]byte{0x40}, bytes.Repeat([]byte{1}, 30)...), 21, nil, false, 0, false},
		{"short len -1", []byte{0x40, 1}, -1, nil, false, 0, false},
		{"empty", nil, 8, nil, false, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cid, long, typ, ok := QUICDestConnID(c.u, c.shortLen)
			if ok != c.ok || long != c.long || (ok && typ != c.typ) {
				t.Fatalf("ok %v long %v typ %d, want ok %v long %v typ %d", ok, long, typ, c.ok, c.long, c.typ)
			}
			if ok && !bytes.Equal(cid, c.cid) {
				t.Errorf("cid %x, want %x", cid, c.cid)
			}
			if ok && len(cid) > 0 && &cid[0] != &c.u[len(c.u)-len(c.u[bytes.Index(c.u, cid):])] {
				t.Error("cid is not a sub-slice of u")
			}
		})
	}
}

// TestQUICTruncatedEveryOffset: a prefix of a valid long header is either the same
// answer (when the header is complete) or not ok.
func TestQUICTruncatedEveryOffset(t *testing.T) {
	u := longHeader(0xc3, quicV1, []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{9, 9}, []byte{0, 0, 0})
	hdr := 1 + 4 + 1 + 8 + 1 + 2
	for n := range len(u) + 1 {
		cid, _, _, ok := QUICDestConnID(u[:n], 8)
		if ok != (n >= hdr) {
			t.Errorf("prefix %d: ok %v", n, ok)
		}
		if ok && len(cid) != 8 {
			t.Errorf("prefix %d: cid %x", n, cid)
		}
	}
}
