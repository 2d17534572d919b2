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
#   scripts/build_toxiproxy.sh --built      exits 0 if that build is there (no Go needed)
#
# The Go it builds with: Toxiproxy v2.12.0's go.mod asks for Go >= 1.23, and
# Debian 12's golang-go is 1.19. The first Go >= 1.23 found is used: $GO, `go`
# on PATH, Debian's versioned packages (/usr/lib/go-1.NN/bin/go, which
# bookworm-backports' golang-1.23-go installs), /usr/local/go (go.dev's
# tarball). Failing that, any Go there is (Debian 12's 1.19 will do) fetches
# the Go 1.23 toolchain from the Go module proxy: the module
# golang.org/toolchain@v0.0.1-go1.23.0.<os>-<arch>, checked against
# sum.golang.org, into Go's module cache (~240 MB, once per user), the very
# download a Go >= 1.21 makes by itself when GOTOOLCHAIN asks for a newer one.
# No root needed, nothing outside the user's Go module cache written.
# STREAMLAB_GO_TOOLCHAIN picks another version (streamlab/lab/toxiproxy_install.py's
# GO_TOOLCHAIN is the same default).
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

GO_NEEDED=23  # Go 1.23: Toxiproxy v2.12.0's go.mod says `go 1.23.0`
GO_TOOLCHAIN="${STREAMLAB_GO_TOOLCHAIN:-go1.23.0}"

# go_minor GO: the minor version of the toolchain GO runs here (19 for go1.19.8),
# empty if it does not run. GOVERSION, not `go version`'s text: with
# GOTOOLCHAIN=go1.23.0 set, a Go >= 1.21 reports (and runs) that one.
go_minor() {
  "$1" env GOVERSION 2>/dev/null | sed -nE 's/^go1\.([0-9]+).*/\1/p'
}

# Every Go on this machine, the likeliest first.
go_candidates() {
  [ -n "${GO:-}" ] && echo "$GO"
  command -v go 2>/dev/null || true
  # Debian's versioned packages (bookworm-backports: golang-1.23-go), newest first.
  ls -d /usr/lib/go-1.*/bin/go 2>/dev/null | sort -t. -k2,2nr || true
  [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go
  return 0
}

json_field() {  # json_field NAME < `go mod download -json` output
  python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d.get(sys.argv[1]) or "")' "$1"
}

# Sets GO to a Go that builds Toxiproxy (see the top of this file), or exits 1
# saying what to install.
find_go() {
  local candidate minor fetcher="" fetcher_version="" os arch json dir work
  while read -r candidate; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    minor=$(go_minor "$candidate")
    [ -n "$minor" ] || continue
    if [ "$minor" -ge "$GO_NEEDED" ]; then
      GO=$candidate
      say "building with $GO ($("$GO" env GOVERSION))"
      return
    fi
    [ -n "$fetcher" ] || { fetcher=$candidate; fetcher_version=$("$candidate" env GOVERSION); }
  done < <(go_candidates)
  if [ -z "$fetcher" ]; then
    echo "Toxiproxy is built from source with Go, and there is none here (not on PATH," \
         "not in /usr/lib/go-1.*, not in /usr/local/go). Any Go will do: Debian's" \
         "(sudo apt-get install -y golang-go); this script fetches Go 1.$GO_NEEDED with it." >&2
    exit 1
  fi
  os=$("$fetcher" env GOHOSTOS) arch=$("$fetcher" env GOHOSTARCH)
  say "$fetcher is $fetcher_version, older than the Go 1.$GO_NEEDED Toxiproxy needs:" \
      "fetching the $GO_TOOLCHAIN toolchain from the Go module proxy with it" \
      "(golang.org/toolchain, checked against sum.golang.org; once, into Go's module cache)"
  # Outside any module (an empty directory), so no go.mod is read or written.
  work=$(mktemp -d)
  if ! json=$(cd "$work" && GOTOOLCHAIN=local "$fetcher" mod download -json \
                "golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.$os-$arch"); then
    rmdir "$work"
    echo "fetching Go $GO_TOOLCHAIN failed: $(json_field Error <<<"$json")" >&2
    echo "Install Go >= 1.$GO_NEEDED instead: Debian 12's bookworm-backports has it" \
         "(sudo apt-get install -y -t bookworm-backports golang-1.$GO_NEEDED-go), or" \
         "https://go.dev/dl/" >&2
    exit 1
  fi
  rmdir "$work"
  dir=$(json_field Dir <<<"$json")
  # A module zip keeps no file modes: the binaries are made executable here, as
  # Go does with a toolchain it fetches itself.
  chmod a+x "$dir"/bin/* "$dir"/pkg/tool/*/*
  GO=$dir/bin/go
  # The fetched toolchain builds with itself (and fetches no other).
  export GOTOOLCHAIN=local
  say "building with $GO ($("$GO" env GOVERSION))"
}

module_dir() {
  # The module's pristine source in Go's module cache (read-only there).
  local json
  json=$("$GO" mod download -json "$MODULE@$VERSION")
  json_field Dir <<<"$json"
}

# apply_patch DIR: the lab's patch, with patch(1), or git's where patch is
# missing (a minimal Debian has neither by default; git usually comes with the clone).
apply_patch() {
  if command -v patch >/dev/null 2>&1; then
    (cd "$1" && patch -s -p1 <"$ROOT/$PATCH")
  elif command -v git >/dev/null 2>&1; then
    # The ceiling keeps git from taking the clone around .tools/ for the
    # repository (it would apply the paths relative to the clone's root).
    (cd "$1" && GIT_CEILING_DIRECTORIES=$(dirname "$PWD") git apply -p1 "$ROOT/$PATCH")
  else
    echo "applying the lab's patch to Toxiproxy needs patch or git:" \
         "sudo apt-get install -y patch" >&2
    exit 1
  fi
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
    apply_patch "$into"
  fi
}

regression_test() {
  (cd "$1" && CGO_ENABLED=0 "$GO" test -count=1 -timeout 120s -run "$TEST_NAME" .)
}

built() { [ -f "$STAMP" ] && [ -x "$BIN/toxiproxy-server" ] && [ -x "$BIN/toxiproxy-cli" ]; }

case "${1:-}" in
  --built)
    built
    exit
    ;;
  --test)
    find_go
    [ -d "$SRC" ] || tree "$SRC" patched
    say "the blocked-writer regression test on the patched Toxiproxy $VERSION"
    regression_test "$SRC"
    exit
    ;;
  --show-wedge)
    find_go
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
  *) echo "usage: $0 [--test|--show-wedge|--built]" >&2; exit 2 ;;
esac

if built; then
  exit 0
fi
say "building Toxiproxy $VERSION with the lab's patch (interruptible sends)"
find_go
tree "$SRC" patched
mkdir -p "$BIN"
# CGO_ENABLED=0: static binaries, which the compose lab's Toxiproxy image
# (FROM scratch, scripts/compose_images.sh) reuses as they are. -buildvcs=false:
# the source sits inside the clone, whose git state is not Toxiproxy's.
ldflags="-X $MODULE.Version=$VERSION+streamlab"
(cd "$SRC" && CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" \
  -o "$BIN/toxiproxy-server" ./cmd/server)
(cd "$SRC" && CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" \
  -o "$BIN/toxiproxy-cli" ./cmd/cli)
rm -f "$BIN"/.toxiproxy-*
touch "$STAMP"
