package blsync

import "strconv"

// deltaFast reads a stored delta as the writer encodes it (encodeDelta: the
// members of DeltaRecord, strings with no escapes, integers) into rec without
// reflection, some ten times faster than encoding/json: every node decodes every
// delta. It reports false for anything else (escapes, other members or values,
// a member repeated, bad UTF-8, trailing bytes), which encoding/json then reads;
// it never accepts what encoding/json refuses, nor reads a delta otherwise
// (FuzzDeltaFast checks both).
func deltaFast(b []byte, rec *DeltaRecord) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	var seen [5]bool
	i, ok := members(b, i, func(key string, i int) (int, bool) {
		k := -1
		var ok bool
		switch key {
		case "version":
			k = 0
			rec.Version, i, ok = flatInt(b, i)
		case "who":
			k = 1
			rec.Who, i, ok = flatString(b, i)
		case "time":
			k = 2
			var j int
			if _, j, ok = flatString(b, i); ok {
				ok = rec.Time.UnmarshalJSON(b[i:j]) == nil
				i = j
			}
		case "add":
			k = 3
			rec.Add = []DeltaAdd{}
			i, ok = elements(b, i, func(i int) (int, bool) {
				var a DeltaAdd
				i, ok := addFast(b, i, &a)
				rec.Add = append(rec.Add, a)
				return i, ok
			})
		case "remove":
			k = 4
			rec.Remove = []string{}
			i, ok = elements(b, i, func(i int) (int, bool) {
				s, i, ok := flatString(b, i)
				rec.Remove = append(rec.Remove, s)
				return i, ok
			})
		}
		if k < 0 || !ok || seen[k] {
			return 0, false
		}
		seen[k] = true
		return i, true
	})
	return ok && skipWS(b, i) == len(b)
}

// addFast reads one addition of a delta at b[i], an object.
func addFast(b []byte, i int, a *DeltaAdd) (int, bool) {
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	var seen [3]bool
	return members(b, i, func(key string, i int) (int, bool) {
		k := -1
		var ok bool
		switch key {
		case "p":
			k = 0
			a.Prefix, i, ok = flatString(b, i)
		case "x":
			k = 1
			a.Expires, i, ok = flatInt(b, i)
		case "r":
			k = 2
			a.Reason, i, ok = flatString(b, i)
		}
		if k < 0 || !ok || seen[k] {
			return 0, false
		}
		seen[k] = true
		return i, true
	})
}

// members reads the object at b[i] (a '{'), calling value with each member's
// key and the index of its value, which returns the index after the value; it
// returns the index after the object.
func members(b []byte, i int, value func(key string, i int) (int, bool)) (int, bool) {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		key, j, ok := flatString(b, i)
		if !ok {
			return 0, false
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ':' {
			return 0, false
		}
		if i, ok = value(key, skipWS(b, i+1)); !ok {
			return 0, false
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return 0, false
		}
		if b[i] == '}' {
			return i + 1, true
		}
		if b[i] != ',' {
			return 0, false
		}
		i = skipWS(b, i+1)
	}
}

// elements reads the array at b[i], calling elem with the index of each
// element, which returns the index after it; it returns the index after the
// array.
func elements(b []byte, i int, elem func(i int) (int, bool)) (int, bool) {
	if i >= len(b) || b[i] != '[' {
		return 0, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		var ok bool
		if i, ok = elem(i); !ok {
			return 0, false
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return 0, false
		}
		if b[i] == ']' {
			return i + 1, true
		}
		if b[i] != ',' {
			return 0, false
		}
		i = skipWS(b, i+1)
	}
}

// flatInt reads an integer at b[i] (an optional '-', then 0 or digits not
// starting with 0) that fits in an int64, and returns it and the index after it.
func flatInt(b []byte, i int) (int64, int, bool) {
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	d := j
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	if j == d || b[d] == '0' && j > d+1 {
		return 0, 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, 0, false
	}
	v, err := strconv.ParseInt(string(b[i:j]), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return v, j, true
}
