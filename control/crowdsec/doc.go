// Package crowdsec makes controld a bouncer of CrowdSec's Local API, keeping a
// named blacklist in step with CrowdSec's decisions, and reads the same decision
// shape when a risk engine pushes it to Tiergate's API.
//
// The Local API's bouncer protocol: GET /v1/decisions/stream with the header
// X-Api-Key (a key `cscli bouncers add tiergate` prints); the first pull with
// startup=true answers every active decision, each later one the decisions new
// and deleted since the bouncer's last pull:
//
//	{"new":     [{"id":7,"value":"198.51.100.7","scope":"Ip","type":"ban",
//	              "duration":"3h59m58.5s","origin":"cscli","scenario":"…"}],
//	 "deleted": [{"id":3,"value":"203.0.113.0/24","scope":"Range",…,"duration":"-2s"}]}
//
// Either list may be null. Deletions are applied before additions. Decisions of
// scope Ip (an address) and Range (a CIDR prefix) are taken, IPv4 and IPv6; a
// decision's duration, from the time of the answer, becomes its entry's expiry,
// so the nodes lift it when it ends with no further write. Other scopes, types
// not enforced (only ban by default), bad values and decisions already over are
// skipped and counted (Stats.Skipped, by reason). An answer other than 200, over
// its bound or not decoding is an *AnswerError.
//
// A Bouncer turns its first pull into one Replace of the list and each later
// pull into one Delta (none when nothing changed) through a Sink, controld's
// blacklist writer; after any failure it starts over with startup=true. Every
// ResyncInterval it pulls every active decision again and writes only the
// difference: the stream reports only the longest decision on an address, so a
// shorter one left when the longer is deleted shows only then.
// For pushes to Tiergate's API, DecodePush reads the same stream or an array of
// new decisions, Check names each bad value or duration by its place
// ("new[3].value"), and ToDelta turns the stream into one Delta, with no memory
// of earlier ones, and the additions' scenarios as their reasons.
package crowdsec
