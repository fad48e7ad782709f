#!/bin/bash
# overlay.sh GO OUT: writes OUT, a `go build -overlay` file that replaces standard
# library files with their patched copies in _<go1.N>/, and prints its path. When the
# Go in use has no patches here, or a file the patch was made from has changed,
# nothing is printed (the build goes on with the standard library as it is) and the
# reason goes to stderr.
set -euo pipefail
go=${1:-go}
out=${2:?usage: overlay.sh GO OUT}
here=$(cd "$(dirname "$0")" && pwd)
goroot=$("$go" env GOROOT)
version=$("$go" env GOVERSION)
minor=$(sed -E 's/^(go[0-9]+\.[0-9]+).*/\1/' <<<"$version")
dir=$here/_$minor
if [ ! -d "$dir" ]; then
	echo "stdpatch: no patches for $version; building with the standard library as it is" >&2
	exit 0
fi
entries=()
while IFS= read -r f; do
	rel=${f#"$dir"/}
	orig=$goroot/src/$rel
	want=$(cat "$f.base.sha256")
	if [ ! -f "$orig" ] || [ "$(sha256sum "$orig" | cut -d' ' -f1)" != "$want" ]; then
		echo "stdpatch: $orig is not the file $rel was patched from; building with the standard library as it is" >&2
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
