#!/bin/bash
# overlay.sh GO OUT: writes OUT, a `go build -overlay` file that replaces standard
# library files with their patched copies in _<go1.N>/, and prints its path.
#
# _<go1.N>/GOVERSION names the Go release the patched copies were made from, and each
# copy's .base.sha256 the SHA-256 of the file it was made from. Where the patches
# cannot be applied:
#   - no _<go1.N>/ for this Go, or this Go is another go1.N release whose file has
#     changed: nothing is printed, the reason goes to stderr, exit status 0 (the build
#     goes on with the standard library as it is);
#   - this Go is the release the patches were made from, and a file is not the one
#     they were made from (or is missing): nothing is printed, an error goes to
#     stderr, exit status 3. The Makefile's `make test` fails on it: on that Go the
#     patch must apply, or the tests would pass on the standard library as it is.
# Any other failure of the script exits non-zero as well.
#
# STDPATCH_GOROOT, when set, is the Go tree whose files are compared and replaced,
# instead of `GO env GOROOT` (to see what the script does with another tree).
set -euo pipefail
go=${1:-go}
out=${2:?usage: overlay.sh GO OUT}
here=$(cd "$(dirname "$0")" && pwd)
goroot=${STDPATCH_GOROOT:-$("$go" env GOROOT)}
version=$("$go" env GOVERSION)
minor=$(sed -E 's/^(go[0-9]+\.[0-9]+).*/\1/' <<<"$version")
dir=$here/_$minor
if [ ! -d "$dir" ]; then
	echo "stdpatch: no patches for $version; building with the standard library as it is" >&2
	exit 0
fi
madefrom=$(cat "$dir/GOVERSION")
entries=()
while IFS= read -r f; do
	rel=${f#"$dir"/}
	orig=$goroot/src/$rel
	want=$(cat "$f.base.sha256")
	got=missing
	if [ -f "$orig" ]; then
		got=$(sha256sum "$orig" | cut -d' ' -f1)
	fi
	if [ "$got" != "$want" ]; then
		if [ "$version" = "$madefrom" ]; then
			echo "stdpatch: ERROR: $version is the Go the patches in stdpatch/_$minor were made from, but $orig (SHA-256 $got) is not the file $rel was patched from (SHA-256 $want): the patch cannot be applied" >&2
			exit 3
		fi
		echo "stdpatch: $orig is not the file $rel was patched from (in $madefrom; this is $version); building with the standard library as it is" >&2
		exit 0
	fi
	entries+=("\"$orig\": \"$f\"")
done < <(find "$dir" -name '*.go' | sort)
mkdir -p "$(dirname "$out")"
{
	printf '{"Replace": {'
	(IFS=,; printf '%s' "${entries[*]}")
	printf '}}\n'
} > "$out"
echo "$out"
