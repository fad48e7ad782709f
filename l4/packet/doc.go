// Package packet parses and builds the frames the L4 load distributor forwards:
// Ethernet (with one 802.1Q tag), ARP, IPv4, IPv6 with extension headers and
// fragments, TCP, UDP, ICMP and ICMPv6 (echo, errors, neighbour discovery), GRE and
// IPIP, plus checksums, encapsulation, MSS clamping, QUIC connection-ID extraction and
// flow hashing. It is the pure-Go half of the DPDK datapath, so every per-packet
// decision can be unit-tested, fuzzed and benchmarked without DPDK.
//
// # Hot-path rules
//
// Every function that the datapath calls per packet works in place on the caller's
// bytes, never allocates, uses no interfaces or maps, and returns one of the sentinel
// errors ([ErrTruncated], [ErrMalformed], [ErrChecksum], [ErrUnsupported], [ErrNoRoom])
// unwrapped, so a caller can switch on it and count a drop reason. Any input, however
// short or random, yields an error rather than a panic; the fuzz tests hold the package
// to that.
//
// # Parsing
//
// [Parse] fills a [Packet], which records offsets into the frame (L3, L4, End) and the
// few fields the distributor decides on (addresses, ports, protocol, TCP flags, TTL,
// fragment state, ICMP type). IPv4 header checksums, lengths and TCP/UDP header
// lengths are validated; transport checksums are not (see [VerifyL4Checksum]), because
// the member that terminates the connection checks them anyway. [ParseIP] does the
// same for a bare IP packet, such as the inner packet of a tunnel, and [ICMPEmbedded]
// for the header quoted in an ICMP error.
//
// # Tunnels
//
// An [Encap] holds a prepared header template (Ethernet + outer IPv4 or IPv6 + GRE,
// or IPIP) for one member. [Encap.Write] prepends it in the headroom before the inner
// packet, touching only the length, ID, DF bit and checksum fields. [Decap] is the
// reverse for packets coming back from a member; [WriteEthernet] and [DecTTL] finish
// the forwarding of the decapsulated packet. The tunnel format, the rules a tunnel
// packet must pass and the Internet checksum are package wire's, which l7d's end of
// the tunnel uses too, so both tiers accept and refuse the same packets.
package packet
