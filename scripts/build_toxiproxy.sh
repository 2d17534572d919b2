#!/usr/bin/env bash
# Builds the lab's Toxiproxy: the pinned module's source (from the Go module
# proxy) with the lab's patch applied, as static binaries in .tools/bin.
#
# Why a patch: upstream Toxiproxy wedges its control API when a toxic is added,
# removed or reset on a proxy while one of its links is blocked writing to a
# reader that stopped reading (upstream report "Toxiproxy control port hangs on
# removing a toxic", still open; the lab's slow-reader
# scenarios make exactly such readers). The last toxic on the link sits in a
# send that no interrupt reaches, the collection's lock stays held, and every
# later API call on that proxy hangs (the API answers 503 after its timeout).
# proxies/toxiproxy/patches/interruptible-sends.patch makes every toxic's send
# interruptible (a chunk it could not hand on is kept, in order, for the next
# run) and takes the removal of a toxic off the link's writer entirely.
# proxies/toxiproxy/patches/blocked_writer_test.go hangs without it.
#
#   scripts/build_toxiproxy.sh              build, if the patch or version changed
#   scripts/build_toxiproxy.sh --test       the regression test on the patched source
#   scripts/build_toxiproxy.sh --show-wedge the same test on the unpatched source:
#                                           exits 0 only if it fails there (wedges)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
MODULE=github.com/Shopify/toxiproxy/v2
PATCHES=proxies/toxiproxy/patches
PATCH=$PATCHES/interruptible-sends.patch
TEST=$PATCHES/blocked_writer_test.go
TEST_NAME=TestToxicChangesDoNotWaitForABlockedWriter
BIN="${TOXIPROXY_BIN:-.tools/bin}"
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
# The build is redone when the version, the patch or its test changes.
KEY=$VERSION-$(cat "$PATCH" "$TEST" | sha256sum | cut -c1-12)
SRC=.tools/src/toxiproxy-$KEY
STAMP=$BIN/.toxiproxy-$KEY

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

if ! command -v go >/dev/null 2>&1; then
  echo "Toxiproxy is built with Go, which is missing. Install Go (>= 1.23)." >&2
  exit 1
fi

module_dir() {
  # The module's pristine source in Go's module cache (read-only there).
  local json
  json=$(go mod download -json "$MODULE@$VERSION")
  python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["Dir"])' <<<"$json"
}

# tree DIR [patched]: a writable copy of the source with the regression test
# beside the package it tests, and the patch applied when asked.
tree() {
  local into=$1 patched=${2:-}
  rm -rf "$into"
  mkdir -p "$(dirname "$into")"
  cp -r "$(module_dir)" "$into"
  chmod -R u+w "$into"
  cp "$TEST" "$into/"
  if [ -n "$patched" ]; then
    (cd "$into" && patch -s -p1 <"$ROOT/$PATCH")
  fi
}

regression_test() {
  (cd "$1" && CGO_ENABLED=0 go test -count=1 -timeout 120s -run "$TEST_NAME" .)
}

case "${1:-}" in
  --test)
    [ -d "$SRC" ] || tree "$SRC" patched
    say "the blocked-writer regression test on the patched Toxiproxy $VERSION"
    regression_test "$SRC"
    exit
    ;;
  --show-wedge)
    pristine=.tools/src/toxiproxy-$VERSION-unpatched
    tree "$pristine"
    say "the blocked-writer regression test on the UNPATCHED Toxiproxy $VERSION (must fail)"
    if regression_test "$pristine"; then
      echo "the test passed without the patch: it does not show the wedge" >&2
      exit 1
    fi
    say "it failed without the patch, as it must: the wedge is real and the test sees it"
    exit 0
    ;;
  "") ;;
  *) echo "usage: $0 [--test|--show-wedge]" >&2; exit 2 ;;
esac

if [ -f "$STAMP" ] && [ -x "$BIN/toxiproxy-server" ] && [ -x "$BIN/toxiproxy-cli" ]; then
  exit 0
fi
say "building Toxiproxy $VERSION with the lab's patch (interruptible sends)"
tree "$SRC" patched
mkdir -p "$BIN"
# CGO_ENABLED=0: static binaries, which the compose lab's Toxiproxy image
# (FROM scratch, scripts/compose_images.sh) reuses as they are.
ldflags="-X $MODULE.Version=$VERSION+streamlab"
(cd "$SRC" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
  -o "$BIN/toxiproxy-server" ./cmd/server)
(cd "$SRC" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
  -o "$BIN/toxiproxy-cli" ./cmd/cli)
rm -f "$BIN"/.toxiproxy-*
touch "$STAMP"
