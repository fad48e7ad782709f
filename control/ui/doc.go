// Package ui is controld's built-in dashboard: the page at /ui, its assets
// embedded in the binary (embed.FS; no other host is needed to load it), and the
// JSON it draws from at /v1/ui/dashboard.
//
// # Where the figures come from
//
// A Source answers the dashboard (Dashboard: one time axis, the panels' series,
// the scrape targets and the certificates' days left) for a window of the recent
// past. There are two, and the page does not depend on which:
//
//   - Scraper (the default) gathers the figures itself: every Interval (2s) it
//     reads the nodes the store knows (their status keys, control/agent), scrapes
//     the /metrics of every l7d, l4d and keyserverd where its status says its
//     metrics are (its admin endpoint; an l7d or l4d that does not say, at its
//     address), keeps per node only the sums each panel needs, and keeps History
//     (16 minutes) of rounds in a ring: memory is bounded by the rounds, the nodes
//     (MaxTargets) and the series per node (MaxSeriesPerNode). A node whose status
//     is gone (lost) or whose scrape fails is shown so, and leaves a gap.
//   - Prometheus, with controld's -prometheus URL: the same panels as PromQL over
//     the server's HTTP API (/api/v1/query_range, /api/v1/query); the node is its
//     instance label.
//
// Each panel is one Query (a rate of a counter, a quantile of a histogram's rate,
// or a gauge, summed or taken the max of by some labels), written once: Scraper
// evaluates it over its rounds the way Prometheus evaluates its PromQL form
// (Query.PromQL), rates over RateWindow (10s) with counter resets counted as
// Prometheus does, quantiles interpolated within buckets as histogram_quantile.
//
// # Routes
//
//	GET /ui                    the page (no data in it; it asks for a token)
//	GET /ui/assets/{file}      its script, style and the charting library (uPlot)
//	GET /v1/ui/dashboard       the figures: ?window=SECONDS (default 900, at most
//	                           History); any API token, viewer included
//
// The page keeps the token it is given in the browser's session storage and sends
// it as a bearer token; a token refused (401) takes it back to the login state, and
// the page shows no figure without one. It reads the node table from /v1/nodes.
//
// # The charting library
//
// assets/uPlot.iife.min.js and uPlot.min.css are the files of the npm package
// uplot at UPlotVersion, vendored with the package's integrity (UPlotIntegrity,
// the npm registry's sha512 of the tarball) and each file's SHA-256, checked by a
// test: they are in the repository rather than fetched at build time so that `go
// build` of controld needs no network and no npm. `make ui-assets` fetches the
// package again from the npm registry and checks it against the same hashes.
package ui
