package prometheus

import _ "embed"

// Rules is tiergate.rules.yml, for a program that starts Prometheus with it
// (tgdemo) without the source tree at hand.
//
//go:embed tiergate.rules.yml
var Rules []byte
