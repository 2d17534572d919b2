#!/usr/bin/env bash
# Builds the local base images that stand in for the public ones on a machine
# that cannot pull from a registry, and prints the variables compose.yaml reads:
#
#   PYTHON_IMAGE=localhost/streamlab-base-python:bookworm      (for python:3.12.12-slim-bookworm)
#   NGINX_IMAGE=localhost/streamlab-base-nginx:bookworm        (for nginx:1.27.5)
#   TOXIPROXY_IMAGE=localhost/streamlab-base-toxiproxy:v2.12.0-<patch> (for the `patched` stage of
#     proxies/toxiproxy/Dockerfile, which compiles it in the Go image: the same patched
#     build, from scripts/build_toxiproxy.sh)
#   JAEGER_IMAGE=localhost/streamlab-base-jaeger:v1.75.0                 (for the `built` stage of
#     proxies/jaeger/Dockerfile, compose's `tracing` profile: only where
#     scripts/build_jaeger.sh has kept its binary in ~/.cache/streamlab/bin)
#
# Each one is built only when podman does not have it yet (delete one with
# `podman rmi` to rebuild it). Needs root, podman and debootstrap; called by
# scripts/compose_test.sh with CONTAINERS_CONF already set. Progress goes to
# stderr, the variables to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

TOXIPROXY_VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
SUITE=bookworm
PYTHON_BASE="localhost/streamlab-base-python:$SUITE"
NGINX_BASE="localhost/streamlab-base-nginx:$SUITE"
# Tagged with the patch's hash, so an image of an older (or unpatched) build is
# never reused.
TOXIPROXY_PATCH=$(cat proxies/toxiproxy/patches/* | sha256sum | cut -c1-12)
TOXIPROXY_BASE="localhost/streamlab-base-toxiproxy:$TOXIPROXY_VERSION-$TOXIPROXY_PATCH"

JAEGER_VERSION="${JAEGER_VERSION:-v1.75.0}"
JAEGER_BASE="localhost/streamlab-base-jaeger:$JAEGER_VERSION"
JAEGER_CACHED="${XDG_CACHE_HOME:-$HOME/.cache}/streamlab/bin/jaeger-$JAEGER_VERSION"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# The mirror apt already uses here (plain HTTP works without extra CAs).
debian_mirror() {
  if [ -n "${STREAMLAB_DEBIAN_MIRROR:-}" ]; then echo "$STREAMLAB_DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(grep -hsoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' \
          /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
        | head -n1 | awk '{print $2}') || true
  echo "${uri:-http://deb.debian.org/debian}"
}

build_python_base() {
  local work rootfs
  work=$(mktemp -d "${TMPDIR:-/tmp}/streamlab-rootfs.XXXXXX")
  rootfs="$work/rootfs"
  say "debootstrap $SUITE (python3, venv, CA certificates) from $(debian_mirror)"
  # minbase: the essentials plus apt, nothing else; the images add what they need.
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$rootfs" "$(debian_mirror)" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; rm -rf "$work"; return 1; }
  # Extra CAs this machine trusts (an egress proxy's, say): without them pip's
  # HTTPS downloads inside image builds fail verification.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  : >"$rootfs/etc/resolv.conf"  # the runtime provides its own
  # PIP_CERT: pip in a venv uses its own CA bundle unless told the system's.
  tar --numeric-owner -C "$rootfs" -cf - . | podman import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    - "$PYTHON_BASE" >/dev/null
  rm -rf "$work"
}

build_nginx_base() {
  local empty
  empty=$(mktemp -d)  # the build copies nothing: an empty context
  say "building $NGINX_BASE (nginx-light from Debian on the python base)"
  # Like the official image: nginx on PATH, a shell (the health check uses bash).
  podman build -q -t "$NGINX_BASE" -f - "$empty" >/dev/null <<EOF
FROM $PYTHON_BASE
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
EOF
  rmdir "$empty"
}

build_toxiproxy_base() {
  # The lab's patched static binaries (scripts/build_toxiproxy.sh; make up and
  # make test have built them already, this only checks).
  local bin=.tools/bin
  bash scripts/build_toxiproxy.sh >&2
  say "building $TOXIPROXY_BASE (FROM scratch, the official image's layout)"
  podman build -q -t "$TOXIPROXY_BASE" -f - "$bin" >/dev/null <<'EOF'
FROM scratch
COPY toxiproxy-server /toxiproxy
COPY toxiproxy-cli /toxiproxy-cli
EXPOSE 8474
ENTRYPOINT ["/toxiproxy"]
CMD ["-host=0.0.0.0"]
ENV LOG_LEVEL=info
EOF
}

build_jaeger_base() {
  # The static binary scripts/build_jaeger.sh keeps, on the Python base (bash
  # for the health check), as the Dockerfile's `built` stage lays it out.
  local context
  context=$(mktemp -d)
  cp "$JAEGER_CACHED" "$context/jaeger"
  say "building $JAEGER_BASE (the cached Jaeger on the python base)"
  podman build -q -t "$JAEGER_BASE" -f - "$context" >/dev/null <<EOF
FROM $PYTHON_BASE
COPY jaeger /jaeger
EOF
  rm -rf "$context"
}

podman image exists "$PYTHON_BASE" || build_python_base
podman image exists "$NGINX_BASE" || build_nginx_base
podman image exists "$TOXIPROXY_BASE" || build_toxiproxy_base

echo "PYTHON_IMAGE=$PYTHON_BASE"
echo "NGINX_IMAGE=$NGINX_BASE"
echo "TOXIPROXY_IMAGE=$TOXIPROXY_BASE"
if podman image exists "$JAEGER_BASE" || { [ -x "$JAEGER_CACHED" ] && build_jaeger_base; }; then
  echo "JAEGER_IMAGE=$JAEGER_BASE"
fi
