#!/usr/bin/env bash
# `make fresh-debian`: the README's promise, kept on a Debian 12 as shipped.
# A Debian 12 (bookworm) container built with debootstrap, holding Debian's
# packages only, and only the README's Requirements (python3, python3-venv,
# golang-go, which is Go 1.19, make, ca-certificates), gets a copy of this
# working tree (`git ls-files -co --exclude-standard`: uncommitted work
# included, ignored files such as .venv/ and .tools/ left out) and runs:
#
#   root   make up  (installs nginx and redis-server from Debian, builds the
#                    venv from PyPI, fetches Go 1.23 with Debian's Go and
#                    builds Toxiproxy), then streamlab chat "hello", make down
#   user   the same as a user who is not root, on a machine where root has
#                    installed nginx only: make up says it cannot install
#                    redis-server, goes on, and the lab runs one gateway on
#                    the memory store
#
# Each in a container of its own, removed at the end whatever happens.
# FRESH_DEBIAN_AS="root" (or "user") runs one of the two; the default is both.
# Needs root, podman, runc and debootstrap on this machine (Debian: apt-get
# install podman runc debootstrap), and the network: Debian's mirror (the one
# apt uses here), PyPI and the Go module proxy. The rootfs is cached as a
# tarball under ~/.cache/streamlab/fresh-debian ($XDG_CACHE_HOME) and as a
# podman image; delete them to start over. Measured on 2 cores: the rootfs
# ~70 s (once), then each user ~70 s (~4 min in all the first time, under 3
# after). Not in CI: too slow for every run.
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
# The README's Requirements, nothing more: the proof is that they are enough.
PACKAGES=python3,python3-venv,golang-go,make,git,ca-certificates
AS="${FRESH_DEBIAN_AS:-root user}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/streamlab/fresh-debian"
# What the container runs: the README's two steps, then `make down`.
STEPS='make up && .venv/bin/streamlab chat "hello" --tokens 10 && make down'

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
started=$SECONDS
took() { echo "$((SECONDS - $1)) s"; }

missing=()
for tool in podman runc debootstrap git; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "missing: ${missing[*]} (Debian: sudo apt-get install -y podman runc debootstrap git)" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "make fresh-debian needs root (debootstrap, and podman's bridge network)" >&2
  exit 1
fi
for who in $AS; do
  case "$who" in root | user) ;; *) echo "FRESH_DEBIAN_AS: root and/or user, not $who" >&2; exit 2 ;; esac
done

RUN=$(mktemp -d "${TMPDIR:-/tmp}/streamlab-fresh-debian.XXXXXX")
containers=()
cleanup() {
  local name
  for name in "${containers[@]}"; do podman rm -f -t 0 "$name" >/dev/null 2>&1 || true; done
  rm -rf "$RUN"
}
trap cleanup EXIT

# podman's configuration for this run only, as scripts/compose_test.sh writes it:
# runc (crun cannot set rlimits here), ulimits within this shell's hard limits,
# cgroupfs and a file event log (no systemd).
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=16384
[ "$nproc" = unlimited ] && nproc=8192
nofile=$((nofile < 16384 ? nofile : 16384)) nproc=$((nproc < 8192 ? nproc : 8192))
cat >"$RUN/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$RUN/containers.conf"

# The mirror apt already uses here (scripts/compose_images.sh picks it the same way).
debian_mirror() {
  if [ -n "${STREAMLAB_DEBIAN_MIRROR:-}" ]; then echo "$STREAMLAB_DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -hsoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
          /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | head -n1 | awk '{print $2}') || true
  echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR=$(debian_mirror)
# Extra CAs this machine trusts (an egress proxy's, say): HTTPS from inside the
# container (PyPI, the Go module proxy) fails verification without them.
extra_cas=()
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  extra_cas=(/usr/local/share/ca-certificates/*.crt)
fi
KEY=$( { echo "$SUITE $PACKAGES $MIRROR"; cat "${extra_cas[@]}" /dev/null; } | sha256sum | cut -c1-12)
ROOTFS_TAR=$CACHE/$SUITE-$KEY.tar
IMAGE=localhost/streamlab-fresh-debian:$SUITE-$KEY

# --- the rootfs: debootstrap, once -------------------------------------------------
if [ ! -f "$ROOTFS_TAR" ]; then
  t=$SECONDS
  say "debootstrap $SUITE (minbase + $PACKAGES) from $MIRROR"
  rootfs=$RUN/rootfs
  # minbase: Debian's essential packages and apt; then the README's Requirements.
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
    >"$RUN/debootstrap.log" 2>&1 || { tail -n 20 "$RUN/debootstrap.log" >&2; exit 1; }
  if [ "${#extra_cas[@]}" -gt 0 ]; then
    cp "${extra_cas[@]}" "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    # pip in a venv trusts its own CA bundle unless told the system's (this
    # machine's pip is told so too: /etc/pip.conf).
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\ntimeout = 180\n' \
      >"$rootfs/etc/pip.conf"
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  : >"$rootfs/etc/resolv.conf"  # podman provides its own
  mkdir -p "$CACHE"
  tar --numeric-owner -C "$rootfs" -cf "$ROOTFS_TAR.part" .
  mv "$ROOTFS_TAR.part" "$ROOTFS_TAR"
  rm -rf "$rootfs"
  say "rootfs cached: $ROOTFS_TAR ($(du -h "$ROOTFS_TAR" | cut -f1), $(took "$t"))"
else
  say "rootfs from the cache: $ROOTFS_TAR"
fi
if ! podman image exists "$IMAGE"; then
  podman import -q \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$ROOTFS_TAR" "$IMAGE" >/dev/null
fi

# --- the working tree, as a clone with its uncommitted work would be ------------------
# Tracked files still there, and untracked ones git does not ignore.
git ls-files -co --exclude-standard -z \
  | while IFS= read -r -d '' f; do if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi; done \
  | tar --null -T - -cf "$RUN/tree.tar"
say "the working tree: $(tar -tf "$RUN/tree.tar" | wc -l) files"

# run_in NAME USER DIR: the steps in the container NAME, as USER, in DIR, with
# the PATH Debian gives that user (a user's has no /usr/sbin); its output
# indented, its status returned.
run_in() {
  local name=$1 user=$2 dir=$3 path=/usr/local/bin:/usr/bin:/bin
  [ "$user" = root ] && path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  podman exec --user "$user" --env HOME="$(dirname "$dir")" --env PATH="$path" \
    --env LANG=C.UTF-8 --workdir "$dir" "$name" bash -c "set -x; $STEPS" 2>&1 \
    | sed -u 's/^/    | /'
}

failed=()
for who in $AS; do
  t=$SECONDS
  name=streamlab-fresh-debian-$$-$who
  containers+=("$name")
  podman run -d --name "$name" --hostname fresh-debian "$IMAGE" sleep infinity >/dev/null
  # shellcheck disable=SC2016  # expanded in the container
  podman exec "$name" bash -c '. /etc/os-release; echo "$PRETTY_NAME, $(python3 --version)," \
    "$(go version | cut -d" " -f3), $(dpkg-query -f . -W | wc -c) packages"' | sed 's/^/    /'
  if [ "$who" = root ]; then
    dir=/root/streamlab
    podman exec -i "$name" bash -c "mkdir -p $dir && tar -xf - -C $dir" <"$RUN/tree.tar"
    say "[root] $STEPS"
    user=root
  else
    dir=/home/lab/streamlab
    say "[user] root installs nginx only (the lab cannot run without it); then a user named lab"
    podman exec "$name" bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq nginx >/dev/null && useradd -m -s /bin/bash lab' 2>&1 \
      | sed -u 's/^/    | /'
    podman exec -i --user lab "$name" bash -c "mkdir -p $dir && tar -xf - -C $dir" <"$RUN/tree.tar"
    say "[user] as lab (not root), no redis-server, no chromium: $STEPS"
    user=lab
  fi
  if run_in "$name" "$user" "$dir"; then
    say "[$who] passed: make up, a chat, make down ($(took "$t"))"
  else
    say "[$who] FAILED ($(took "$t")); the lab's logs:"
    podman exec "$name" bash -c "tail -n 20 $dir/.run/*.log 2>/dev/null" | sed 's/^/    | /' || true
    failed+=("$who")
  fi
  podman rm -f -t 0 "$name" >/dev/null
done

if [ "${#failed[@]}" -gt 0 ]; then
  say "make fresh-debian FAILED for: ${failed[*]} ($(took "$started"))"
  exit 1
fi
say "make fresh-debian passed ($AS) in $(took "$started")"
