#!/usr/bin/env bash
# Builds Jaeger (v2: the OpenTelemetry Collector with Jaeger's storage and query
# API) from the pinned module's source on the Go module proxy, into .tools/bin,
# for `streamlab up --tracing` (docs/tracing.md).
#
# `go install module/cmd/jaeger@version` refuses it (its go.mod has a replace
# directive), so the module's source is built as the main module, as
# build_toxiproxy.sh builds Toxiproxy. The first build downloads ~300 modules
# and compiles for ~5 min on 2 cores; the binary is then kept in the user cache
# (~/.cache/streamlab/bin, $XDG_CACHE_HOME) and a later run only copies it.
#
#   scripts/build_jaeger.sh         build (or copy from the cache) .tools/bin/jaeger
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

VERSION="${JAEGER_VERSION:-v1.75.0}"
MODULE=github.com/jaegertracing/jaeger
BIN="${JAEGER_BIN:-.tools/bin}"
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/streamlab/bin"
CACHED=$CACHE/jaeger-$VERSION

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

mkdir -p "$BIN" "$CACHE"
if [ -x "$BIN/jaeger" ] && [ -f "$BIN/.jaeger-$VERSION" ]; then
  exit 0
fi
if [ ! -x "$CACHED" ]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "Jaeger is built with Go, which is missing. Install Go (>= 1.24)." >&2
    exit 1
  fi
  say "building Jaeger $VERSION from the Go module proxy (minutes, once)"
  dir=$(go mod download -json "$MODULE@$VERSION" |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["Dir"])')
  src=.tools/src/jaeger-$VERSION
  rm -rf "$src"
  mkdir -p .tools/src
  cp -r "$dir" "$src"
  chmod -R u+w "$src"
  (cd "$src" && CGO_ENABLED=0 go build -trimpath -o "$CACHED.tmp" ./cmd/jaeger)
  mv "$CACHED.tmp" "$CACHED"
  rm -rf "$src"
fi
cp "$CACHED" "$BIN/jaeger"
rm -f "$BIN"/.jaeger-*
touch "$BIN/.jaeger-$VERSION"
say "Jaeger $VERSION in $BIN/jaeger"
