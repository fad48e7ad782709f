package packet

import "fmt"

// MAC is an Ethernet (EUI-48) address.
type MAC [6]byte

// Broadcast is the Ethernet broadcast address ff:ff:ff:ff:ff:ff.
var Broadcast = MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// String returns the address as six colon-separated lower-case hex bytes.
func (m MAC) String() string {
	const digits = "0123456789abcdef"
	var b [17]byte
	for i, x := range m {
		if i > 0 {
			b[3*i-1] = ':'
		}
		b[3*i], b[3*i+1] = digits[x>>4], digits[x&0x0f]
	}
	return string(b[:])
}

// MarshalText writes m as String does, for YAML and JSON.
func (m MAC) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText parses m as ParseMAC does.
func (m *MAC) UnmarshalText(b []byte) error {
	v, err := ParseMAC(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// IsBroadcast reports whether m is ff:ff:ff:ff:ff:ff.
func (m MAC) IsBroadcast() bool { return m == Broadcast }

// IsMulticast reports whether m is a group address (broadcast included).
func (m MAC) IsMulticast() bool { return m[0]&1 != 0 }

// IsZero reports whether m is 00:00:00:00:00:00, the "unknown" address.
func (m MAC) IsZero() bool { return m == MAC{} }

// ParseMAC parses six hex bytes separated by ':' or '-' ("02:00:5e:10:00:01").
func ParseMAC(s string) (MAC, error) {
	var m MAC
	if len(s) != 17 {
		return m, fmt.Errorf("packet: parsing MAC address %q: want 6 hex bytes separated by ':' or '-'", s)
	}
	sep := s[2]
	if sep != ':' && sep != '-' {
		return m, fmt.Errorf("packet: parsing MAC address %q: want 6 hex bytes separated by ':' or '-'", s)
	}
	for i := range m {
		if i > 0 && s[3*i-1] != sep {
			return MAC{}, fmt.Errorf("packet: parsing MAC address %q: mixed or missing separators", s)
		}
		hi, ok1 := unhex(s[3*i])
		lo, ok2 := unhex(s[3*i+1])
		if !ok1 || !ok2 {
			return MAC{}, fmt.Errorf("packet: parsing MAC address %q: bad hex digit", s)
		}
		m[i] = hi<<4 | lo
	}
	return m, nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
