#!/usr/bin/env bash
# vuln.sh: govulncheck over the module, against the Go vulnerability database.
#
# The database is vuln.go.dev when this machine reaches it. Otherwise it is built here
# from the golang.org/x/vulndb module (the database's own source, served by the Go
# module proxy like any module) with that module's indexdb command, and kept under
# .build/vulndb/<version>. The run says which database it used and how old it is.
# It never passes silently: no database at all is an error, not a clean scan.
#
# Exit status: govulncheck's (0 nothing called is affected, 3 affected), or 2 when no
# database could be had.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
GOVULNCHECK_VERSION=${GOVULNCHECK_VERSION:-v1.9.0}
bin=$($GO env GOPATH)/bin/govulncheck
if ! { [ -x "$bin" ] && "$bin" -version 2>/dev/null | grep -q "govulncheck@${GOVULNCHECK_VERSION}"; }; then
	echo "vuln: installing govulncheck $GOVULNCHECK_VERSION"
	$GO install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION" || { echo "vuln: cannot install govulncheck" >&2; exit 2; }
fi

db=""
if curl -sf -m 10 -o /dev/null https://vuln.go.dev/index/db.json; then
	db=https://vuln.go.dev
	echo "vuln: database https://vuln.go.dev (reachable)"
else
	echo "vuln: https://vuln.go.dev is not reachable from here; building the database from the golang.org/x/vulndb module"
	info=$($GO mod download -json golang.org/x/vulndb@latest 2>/dev/null) || info=""
	ver=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p')
	dir=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [ -z "$ver" ] || [ ! -d "$dir/data/osv" ]; then
		echo "vuln: FAILED: neither https://vuln.go.dev nor the golang.org/x/vulndb module can be reached: no scan was made" >&2
		exit 2
	fi
	out=.build/vulndb/$ver
	if [ ! -f "$out/index/db.json" ]; then
		rm -rf "$out.tmp" && mkdir -p "$(dirname "$out")"
		if ! $GO run "golang.org/x/vulndb/cmd/indexdb@$ver" -vulns "$dir/data/osv" -out "$out.tmp"; then
			echo "vuln: FAILED: building the database from golang.org/x/vulndb@$ver: no scan was made" >&2
			exit 2
		fi
		mv "$out.tmp" "$out"
	fi
	db=file://$(pwd)/$out
	# The pseudo-version carries the commit time of the database's source.
	stamp=$(printf '%s' "$ver" | sed -n 's/.*-\([0-9]\{14\}\)-.*/\1/p')
	echo "vuln: database golang.org/x/vulndb@$ver ($(ls "$dir/data/osv" | wc -l) entries, as of ${stamp:0:4}-${stamp:4:2}-${stamp:6:2})"
fi
echo "vuln: $($GO version)"
"$bin" -db "$db" "$@" ./...
rc=$?
case $rc in
0) echo "vuln: no known vulnerability is called by the code" ;;
3) echo "vuln: the code calls known vulnerabilities (above): see each one's 'Fixed in'" ;;
*) echo "vuln: govulncheck failed (exit $rc)" >&2 ;;
esac
exit $rc
