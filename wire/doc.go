// Package wire is the contract between the tiers: the bytes an L4 distributor (l4d)
// and an L7 node (l7d) exchange and must read alike. It holds the GRE and IPIP
// encapsulation of the tunnel between them with the one set of rules both ends apply
// when they decapsulate, the Internet checksum, and the layout of the QUIC connection
// IDs that l7d issues and l4d routes by.
//
// It imports the standard library only (internal/layers checks that), so l4d links no
// part of the L7 tier's dependencies and both tiers can change everything else freely.
//
// # Tunnel
//
// A tunnel packet is an outer IPv4 or IPv6 header followed by one of:
//
//   - GRE (IP protocol 47, [ProtoGRE]): a GRE header (RFC 2784, with RFC 2890's key
//     and sequence number) whose protocol type is [EtherTypeIPv4] or [EtherTypeIPv6],
//     then the inner IP packet. The tiers send the 4-byte header [PutGRE] writes, or,
//     configured with a tunnel key, the 8-byte one of [PutGREKey]; a tier with a key
//     takes only packets that carry it ([GRE.KeyMatches]), so IPIP only without one.
//   - IPIP (protocol 4, [ProtoIPIP], RFC 2003) carrying an IPv4 packet, or protocol 41
//     ([ProtoIPv6], RFC 2473) carrying an IPv6 packet, directly after the outer header.
//
// [Decap] applies the receiving rules to what follows the outer header; its doc lists
// them. Each refusal is one of four sentinel errors, returned unwrapped so a caller can
// count it by kind without allocating.
//
// # Checksum
//
// [Checksum] is RFC 1071's Internet checksum, summed eight bytes at a time; [Sum] and
// [Fold] are its two halves for callers that add fields incrementally.
//
// # QUIC connection IDs
//
// [EncodeConnID] and [DecodeConnID] are the layout of the connection IDs that carry an
// L7 node's server ID (QUIC-LB's plaintext algorithm); see [ConnIDLen].
//
// Every function here that runs per packet works on the caller's bytes, never
// allocates, and returns an error rather than panicking on any input; a fuzz target
// holds it to that.
package wire
