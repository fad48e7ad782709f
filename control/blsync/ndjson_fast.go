package blsync

import (
	"encoding/json"
	"unicode/utf8"
)

// lineFast reads the usual line, a flat object of the known members with string
// or number values and no escapes, into l without reflection. It reports false
// for anything else (escapes, other values, unknown or repeated members, bad
// UTF-8), which the full decoder then reads; it never accepts what the full
// decoder refuses, nor reads a line otherwise (FuzzLineFast checks both).
func lineFast(b []byte, l *Line) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipWS(b, i+1) == len(b)
	}
	var seen [6]bool
	for {
		key, j, ok := flatString(b, i)
		if !ok {
			return false
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return false
		}
		var str string
		var raw []byte
		if b[i] == '"' {
			s, j, ok := flatString(b, i)
			if !ok {
				return false
			}
			str, raw, i = s, b[i:j], j
		} else {
			j := i
			for j < len(b) && (b[j] >= '0' && b[j] <= '9' || b[j] == '-' || b[j] == '+' || b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
				j++
			}
			if j == i || !json.Valid(b[i:j]) {
				return false
			}
			raw, i = b[i:j], j
		}
		isStr := raw[0] == '"'
		k := -1
		switch key {
		case "ip":
			k, l.IP = 0, str
		case "cidr":
			k, l.CIDR = 1, str
		case "expires":
			k, l.Expires = 2, json.RawMessage(raw)
		case "duration":
			k, l.Duration = 3, json.RawMessage(raw)
		case "reason":
			k, l.Reason = 4, str
		case "op":
			k, l.Op = 5, str
		}
		if k < 0 || seen[k] || (!isStr && k != 2 && k != 3) {
			return false
		}
		seen[k] = true
		i = skipWS(b, i)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			return skipWS(b, i+1) == len(b)
		}
		if b[i] != ',' {
			return false
		}
		i = skipWS(b, i+1)
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// flatString reads a JSON string at b[i] that has no escapes or control bytes
// and is valid UTF-8, and returns it and the index after it.
func flatString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			s := b[i+1 : j]
			if !utf8.Valid(s) {
				return "", 0, false
			}
			return string(s), j + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		}
	}
	return "", 0, false
}
