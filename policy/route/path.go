package route

// Path modes, the values of Listener.PathMode: what becomes of a request whose path,
// as sent, is ambiguous (see CheckPath).
const (
	// PathReject answers 400.
	PathReject = "reject"
	// PathForwardNormalized routes the request on its normalised path and sends
	// that path to the backend (NormalizePath); what cannot be normalised is
	// answered 400.
	PathForwardNormalized = "forward_normalized"
	// PathForwardRaw routes the request on the path as the HTTP server decoded and
	// resolved it, and sends the backend the path as sent: the path a backend
	// resolves may then be one no route was matched on. For backends that need a
	// spelling the other modes refuse, and resolve none of it themselves.
	PathForwardRaw = "forward_raw"
)

// A PathVerdict is what CheckPath finds of a path.
type PathVerdict uint8

const (
	// PathClean: nothing a backend may read differently from the router.
	PathClean PathVerdict = iota
	// PathResolvable: ambiguous, and NormalizePath gives the one reading.
	PathResolvable
	// PathUnresolvable: ambiguous with no one reading (a NUL, double encoding, a
	// segment of dots and spaces other than "." and "..").
	PathUnresolvable
)

// CheckPath says whether a request path as sent (the request target up to its query
// or fragment, percent-encoded as it came) is ambiguous: spelt so that a backend may
// resolve it to another path than the router matched on, as Tomcat resolves
// "/public/..;/admin" and IIS "/public/..%5cadmin" to "/admin" while a router sees a
// path under "/public". A path is ambiguous when it has
//
//   - a dot segment: a segment that, percent-decoded and cut at its first ';' (a
//     path parameter), is "." or "..": "/..", "/%2e%2E", "/.%2e", "/..;x", "/.;";
//   - a backslash, raw or %5C, which some servers take for a slash;
//   - an encoded slash, %2F, which some servers decode before resolving;
//   - an empty segment ("//");
//   - a '%' not followed by two hex digits, which servers read differently;
//   - a NUL (%00), which ends the path for some;
//   - a double-encoded dot, slash, backslash or NUL (%252e, %252f, %255c, %2500),
//     for servers that decode twice;
//   - a segment, before any ';', of dots and spaces only other than "." and ".."
//     ("...", ".. "), which Windows shortens to a dot segment.
//
// The last three are PathUnresolvable, the others PathResolvable. Letters' case does
// not matter in percent-encodings. A path with none of them is PathClean: the router's
// path (decoded, as the HTTP server hands it) is the one any backend decodes.
func CheckPath(raw []byte) PathVerdict {
	v := PathClean
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '\\':
			v = PathResolvable
		case 0:
			return PathUnresolvable
		case '%':
			if i+2 >= len(raw) || !isHex(raw[i+1]) || !isHex(raw[i+2]) {
				v = PathResolvable
				break
			}
			switch unhex(raw[i+1])<<4 | unhex(raw[i+2]) {
			case '/', '\\':
				v = PathResolvable
			case 0:
				return PathUnresolvable
			case '%':
				if i+4 < len(raw) && isHex(raw[i+3]) && isHex(raw[i+4]) {
					switch unhex(raw[i+3])<<4 | unhex(raw[i+4]) {
					case '.', '/', '\\', 0:
						return PathUnresolvable
					}
				}
			}
		}
	}
	for first := true; ; first = false {
		end, next := nextSeparator(raw)
		switch dotSegment(raw[:end]) {
		case dotsOnly:
			return PathUnresolvable
		case dotOne, dotTwo:
			v = PathResolvable
		}
		if next < 0 {
			return v
		}
		if end == 0 && !first {
			v = PathResolvable // an empty segment other than the first: "//"
		}
		raw = raw[next:]
	}
}

const (
	notDots = iota
	dotOne
	dotTwo
	dotsOnly // dots and spaces, at least one dot, not "." or ".."
)

// dotSegment classifies a raw segment by its name: the segment percent-decoded, cut
// at its first ';'.
func dotSegment(seg []byte) int {
	dots, n := 0, 0
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' && i+2 < len(seg) && isHex(seg[i+1]) && isHex(seg[i+2]) {
			c = unhex(seg[i+1])<<4 | unhex(seg[i+2])
			i += 2
		}
		if c == ';' {
			break
		}
		switch c {
		case '.':
			dots++
		case ' ':
		default:
			return notDots
		}
		n++
	}
	switch {
	case dots == 0:
		return notDots
	case dots == n && n == 1:
		return dotOne
	case dots == n && n == 2:
		return dotTwo
	}
	return dotsOnly
}

// NormalizePath appends to dst the one reading of an ambiguous path as sent: '\',
// %5C and %2F are slashes; empty segments are dropped; "." segments (in any
// encoding, with any path parameter) are removed and ".." segments remove the one
// before them, never going above the root; a '%' not starting an encoding is %25.
// Every other segment is kept as it was spelt, so what was encoded stays encoded.
// The result starts with '/', ends with '/' when the path did or its last segment was
// a dot segment, and is PathClean. It returns false, and dst as it was, when the path
// is PathUnresolvable.
func NormalizePath(dst, raw []byte) ([]byte, bool) {
	if CheckPath(raw) == PathUnresolvable {
		return dst, false
	}
	base := len(dst)
	trailing := false // the path ends with a separator or a dot segment
	for {
		end, next := nextSeparator(raw)
		seg := raw[:end]
		switch dotSegment(seg) {
		case dotOne:
			trailing = true
		case dotTwo:
			if i := lastIndexByte(dst[base:], '/'); i >= 0 {
				dst = dst[:base+i]
			}
			trailing = true
		default:
			if len(seg) == 0 {
				trailing = true
				break
			}
			dst = append(dst, '/')
			for i := 0; i < len(seg); i++ {
				if seg[i] == '%' && !(i+2 < len(seg) && isHex(seg[i+1]) && isHex(seg[i+2])) {
					dst = append(dst, "%25"...)
					continue
				}
				dst = append(dst, seg[i])
			}
			trailing = false
		}
		if next < 0 {
			break
		}
		raw = raw[next:]
	}
	if len(dst) == base || trailing {
		dst = append(dst, '/')
	}
	return dst, true
}

// nextSeparator returns where the first segment of raw ends, at a '/', '\', %2F or
// %5C, and where the next one starts: -1 when there is none.
func nextSeparator(raw []byte) (end, next int) {
	for i := 0; i < len(raw); i++ {
		switch raw[i] {
		case '/', '\\':
			return i, i + 1
		case '%':
			if i+2 < len(raw) && isHex(raw[i+1]) && isHex(raw[i+2]) {
				if b := unhex(raw[i+1])<<4 | unhex(raw[i+2]); b == '/' || b == '\\' {
					return i, i + 3
				}
			}
		}
	}
	return len(raw), -1
}

func lastIndexByte(b []byte, c byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}
