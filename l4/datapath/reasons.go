package datapath

import (
	"errors"

	"github.com/tiergate/tiergate/l4/packet"
)

// result is what became of a packet: forwarded, handled locally, or dropped for a
// reason. The names are the values of the result label of
// tiergate_l4_packets_total and are stable.
type result uint8

const (
	resForwarded result = iota
	resLocal            // handled by the LD itself (ARP, ND, echo)
	resMalformed
	resTruncated
	resBadChecksum
	resUnsupported
	resNotLocal
	resNoRule
	resNoMember
	resTableFull
	resTTL
	resNoNeighbor
	resTxFull
	resControlFull
	resTooBig
	resBadTunnel
	resMultiseg
	resReturnWrongPort // tunnelled to the LD but not on its internal port and address
	resReturnNotMember // tunnelled from an address that is not a member's
	resReturnBadKey    // without the configured GRE key, or with another
	resReturnNoFlow    // a reply to no flow in the connection table
	resV4Mapped        // an IPv6 packet with an IPv4-mapped address (::ffff:a.b.c.d)
	resBlacklisted     // to a VIP from a source on a blacklist (Distributor.SetBlacklists)
	resRuleLimit       // a new connection over its rule's static limits (RuleLimits)
	resOverloadQuota   // a new connection (or, with overload.packets, a packet) over its rule's overload quota

	resSynProxyBadCookie // an ACK to a proxied rule whose SYN cookie does not check
	resSynProxyWait      // a proxied connection's packet before its member's handshake completed
	numResults
)

var resultNames = [numResults]string{
	resForwarded:   "forwarded",
	resLocal:       "local",
	resMalformed:   "malformed",
	resTruncated:   "truncated",
	resBadChecksum: "bad_checksum",
	resUnsupported: "unsupported",
	resNotLocal:    "not_local",
	resNoRule:      "no_rule",
	resNoMember:    "no_member",
	resTableFull:   "table_full",
	resTTL:         "ttl",
	resNoNeighbor:  "no_neighbor",
	resTxFull:      "tx_full",
	resControlFull: "control_full",
	resTooBig:      "too_big",
	resBadTunnel:   "bad_tunnel",
	resMultiseg:    "multiseg",

	resReturnWrongPort: "return_wrong_port",
	resReturnNotMember: "return_not_member",
	resReturnBadKey:    "return_bad_key",
	resReturnNoFlow:    "return_no_flow",
	resV4Mapped:        "v4mapped",
	resBlacklisted:     "blacklisted",
	resRuleLimit:       "rule_limit",
	resOverloadQuota:   "overload_quota",

	resSynProxyBadCookie: "synproxy_bad_cookie",
	resSynProxyWait:      "synproxy_wait",
}

func (r result) String() string { return resultNames[r] }

// direction of a packet, the dir label of tiergate_l4_packets_total.
type direction uint8

const (
	dirIn    direction = iota // client → VIP, tunnelled to a member
	dirOut                    // member → client, decapsulated
	dirLocal                  // to the LD itself
	numDirs
)

var dirNames = [numDirs]string{dirIn: "in", dirOut: "out", dirLocal: "local"}

func parseResult(err error) result {
	switch {
	case errors.Is(err, packet.ErrTruncated):
		return resTruncated
	case errors.Is(err, packet.ErrChecksum):
		return resBadChecksum
	case errors.Is(err, packet.ErrUnsupported):
		return resUnsupported
	}
	return resMalformed
}
