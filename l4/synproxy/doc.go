// Package synproxy is the load distributor's SYN proxy: SYN cookies the LD answers a
// client's SYN with, keeping no state, and what a proxied connection needs of its
// packets afterwards: TCP option parsing, the SYN-ACK, the SYN to the member and the ACK
// that completes the member's handshake written in place, and the translation of
// sequence numbers, timestamps, SACK blocks and windows between the client's view and
// the member's, with incremental checksum updates (RFC 1624).
//
// # Cookies
//
// A cookie is the initial sequence number of the LD's SYN-ACK, made as Linux makes
// its own (net/ipv4/syncookies.c):
//
//	cookie = H1(tuple) + clientISN + count<<24 + (H2(tuple, count) + mssIndex) mod 2^24
//
// where H1 and H2 are SipHash-2-4 under a secret key over the 4-tuple (and the minute
// counter for H2), count is the minute (Unix time / 60) the SYN was answered in, and
// mssIndex picks one of 8 MSS values (MSSTable). The ACK that comes back carries
// cookie+1; it checks when count is this minute or the one before and the index is in
// range, which a forged ACK meets with a chance of about 2^-21. When the client sent
// timestamps, the low 6 bits of the LD's TSval carry its window scale (4 bits; 0xf for
// none), SACK-permitted and ECN, as Linux does, and come back in the ACK's TSecr; a SYN
// without timestamps is answered with the MSS alone (no window scaling, no SACK), as
// Linux does.
//
// The keys are derived from a secret and a rotation epoch (Keys): LDs sharing the
// secret accept each other's cookies, and a cookie made under the previous epoch's key
// still checks.
package synproxy
