package clientip

import (
	"bytes"
	"net/netip"
)

// ParseAddr parses one address as proxies write it in X-Forwarded-For elements and
// single-value headers such as X-Real-IP:
//
//	1.2.3.4            2001:db8::1          fe80::1%eth0 (the zone is dropped)
//	1.2.3.4:80         [2001:db8::1]:443    [2001:db8::1]
//
// with optional spaces and tabs around it. IPv4-mapped IPv6 addresses come back as
// IPv4, and the result never has a zone. Anything else ("unknown", an empty element,
// a hostname, an obfuscated RFC 7239 identifier, an IPv4 address with leading zeros,
// a port above 65535) is refused. ParseAddr does not allocate.
func ParseAddr(b []byte) (netip.Addr, bool) {
	b = trimOWS(b)
	if len(b) == 0 {
		return netip.Addr{}, false
	}
	if b[0] == '[' {
		end := bytes.IndexByte(b, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		if rest := b[end+1:]; len(rest) > 0 && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, false
		}
		return parseIPv6(b[1:end])
	}
	colon := bytes.IndexByte(b, ':')
	switch {
	case colon < 0:
		return parseIPv4(b)
	case bytes.IndexByte(b[colon+1:], ':') < 0:
		// One colon: an IPv4 address and a port. A bare IPv6 address has at least two.
		if !validPort(b[colon+1:]) {
			return netip.Addr{}, false
		}
		return parseIPv4(b[:colon])
	default:
		return parseIPv6(b)
	}
}

// trimOWS removes the optional white space (spaces and tabs) HTTP allows around list
// elements.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// validPort reports whether b is a decimal port number from 0 to 65535.
func validPort(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
		if n > 0xffff {
			return false
		}
	}
	return true
}

// parseIPv4 parses a dotted quad with the rules of net/netip: four decimal fields
// from 0 to 255, no leading zeros.
func parseIPv4(b []byte) (netip.Addr, bool) {
	var ip [4]byte
	if !parseIPv4Fields(b, &ip) {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4(ip), true
}

func parseIPv4Fields(b []byte, ip *[4]byte) bool {
	pos, val, digits := 0, 0, 0
	for i, c := range b {
		switch {
		case c >= '0' && c <= '9':
			if digits == 1 && val == 0 {
				return false // a leading zero reads as octal to some parsers
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return false
			}
		case c == '.':
			if digits == 0 || i == len(b)-1 || pos == 3 {
				return false
			}
			ip[pos] = byte(val)
			pos++
			val, digits = 0, 0
		default:
			return false
		}
	}
	if pos != 3 || digits == 0 {
		return false
	}
	ip[3] = byte(val)
	return true
}

// parseIPv6 parses an IPv6 address with the rules of net/netip (groups of at most
// four hex digits, one "::", an optional trailing dotted quad, an optional non-empty
// zone), drops the zone and unmaps IPv4-mapped addresses.
func parseIPv6(s []byte) (netip.Addr, bool) {
	if z := bytes.IndexByte(s, '%'); z >= 0 {
		if z == len(s)-1 {
			return netip.Addr{}, false
		}
		s = s[:z]
	}
	var ip [16]byte
	ellipsis := -1 // where "::" stands in ip
	if len(s) >= 2 && s[0] == ':' && s[1] == ':' {
		ellipsis = 0
		s = s[2:]
		if len(s) == 0 {
			return netip.IPv6Unspecified(), true
		}
	}
	i := 0
	for i < 16 {
		off, acc := 0, uint32(0)
	digits:
		for ; off < len(s); off++ {
			c := s[off]
			switch {
			case c >= '0' && c <= '9':
				acc = acc<<4 + uint32(c-'0')
			case c >= 'a' && c <= 'f':
				acc = acc<<4 + uint32(c-'a'+10)
			case c >= 'A' && c <= 'F':
				acc = acc<<4 + uint32(c-'A'+10)
			default:
				break digits
			}
			if off > 3 {
				return netip.Addr{}, false
			}
		}
		if off == 0 {
			return netip.Addr{}, false
		}
		if off < len(s) && s[off] == '.' {
			// A trailing dotted quad fills the last four bytes.
			if (ellipsis < 0 && i != 12) || i+4 > 16 {
				return netip.Addr{}, false
			}
			var v4 [4]byte
			if !parseIPv4Fields(s, &v4) {
				return netip.Addr{}, false
			}
			copy(ip[i:], v4[:])
			s = nil
			i += 4
			break
		}
		ip[i], ip[i+1] = byte(acc>>8), byte(acc)
		i += 2
		s = s[off:]
		if len(s) == 0 {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return netip.Addr{}, false
		}
		s = s[1:]
		if s[0] == ':' {
			if ellipsis >= 0 {
				return netip.Addr{}, false
			}
			ellipsis = i
			s = s[1:]
			if len(s) == 0 {
				break
			}
		}
	}
	if len(s) != 0 {
		return netip.Addr{}, false
	}
	if i < 16 {
		if ellipsis < 0 {
			return netip.Addr{}, false
		}
		n := 16 - i
		for j := i - 1; j >= ellipsis; j-- {
			ip[j+n] = ip[j]
		}
		clear(ip[ellipsis : ellipsis+n])
	} else if ellipsis >= 0 {
		return netip.Addr{}, false // "::" must stand for at least one group
	}
	return netip.AddrFrom16(ip).Unmap(), true
}
