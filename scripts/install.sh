#!/usr/bin/env bash
# Installs what the lab needs, skipping what is already there:
#   - .venv/ with the project and the extras STREAMLAB_EXTRAS names (default
#     dev,lab,plot: the lab tool, the plots and the dev tools), from the
#     smallest lock under requirements/ that covers them (pinned, hashes
#     checked; scripts/lock.py, `make lock`), then the project itself with
#     `pip install --no-deps -e .`. `make up` asks for `lab` only, what the lab
#     runs; `make test` for all three. A venv that already has a superset of
#     the extras asked for is left as it is.
#   - from Debian's packages, as root: what is missing of python3-venv (the
#     venv), nginx (the edge proxy), redis-server (the replicas' shared resume
#     store), golang-go (any Go: scripts/build_toxiproxy.sh fetches the Go 1.23
#     toolchain with it when it is older, as Debian 12's 1.19 is), patch, and,
#     with the dev tools only (`make test`), chromium (the browser tests)
#   - not root (or no apt-get): it says what it cannot install and goes on with
#     what it can. The default lab, one gateway on the memory store, runs
#     without redis-server and chromium; it cannot run without nginx, a venv or
#     Toxiproxy, so then it exits 1 at the end with the one apt-get line to run
#   - Toxiproxy's server and CLI, built from the pinned module source with the
#     lab's patch (scripts/build_toxiproxy.sh), as .tools/bin/toxiproxy-{server,cli}
#   - with STREAMLAB_WITH_HF=1 only: the `hf` extra (torch, transformers) for the
#     transformers backend. PyPI's Linux x86_64 torch pulls the CUDA libraries
#     (~5 GB installed, ~4 min here); the default lab never needs them. CI sets it.
# Safe to run again; `make up` and `make test` call it first.
set -euo pipefail
cd "$(dirname "$0")/.."

TOXIPROXY_VERSION="${TOXIPROXY_VERSION:-v2.12.0}"
PYTHON="${PYTHON:-python3}"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# --- Python -----------------------------------------------------------------
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "streamlab needs Python >= 3.11 (found: $("$PYTHON" --version 2>&1))." >&2
  exit 1
fi
EXTRAS="${STREAMLAB_EXTRAS:-dev,lab,plot}"
case ",$EXTRAS," in *,dev,*) WITH_DEV=1 ;; *) WITH_DEV=0 ;; esac

# --- Debian's packages ---------------------------------------------------------
# What is missing, installed in one apt-get run as root; otherwise said, and
# left: the lab's own needs (MUST) stop this script at its end, after it has
# done what it could; the rest (optional) only says what goes without.
CAN_APT=0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then CAN_APT=1; fi
apt_wanted=() apt_wanted_norec=() must=() optional=()
want() {  # want must|optional PACKAGE WHY [--no-install-recommends]
  if [ "$CAN_APT" = 1 ]; then
    if [ "${4:-}" = --no-install-recommends ]; then apt_wanted_norec+=("$2"); else apt_wanted+=("$2"); fi
  elif [ "$1" = must ]; then
    must+=("$2") && echo "not installing $2 (needs root): $3" >&2
  else
    optional+=("$2") && echo "not installing $2 (needs root): $3" >&2
  fi
}
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }

# Debian's python3 leaves ensurepip, which `python -m venv` needs, to python3-venv.
if [ ! -x .venv/bin/python ] && ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  want must python3-venv "Python's venv, without which there is no .venv"
fi
# The HTTP/2 edge needs nginx's ssl and http_v2 modules: Debian 12's `nginx`
# has both (its nginx-light is a transitional package for it); another build
# may lack them.
if ! has nginx; then
  want must nginx "the lab's edge proxy; the lab cannot run without it"
else
  nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
  if ! "$nginx_bin" -V 2>&1 | grep -q -- --with-http_v2_module \
     || ! "$nginx_bin" -V 2>&1 | grep -q -- --with-http_ssl_module; then
    want must nginx "this nginx lacks the ssl or http_v2 module (nginx -V) the HTTP/2 edge needs"
  fi
fi
if ! has redis-server; then
  want optional redis-server "only replicas need it (streamlab up --gateways 2; the replica tests and scenarios skip); the default lab, one gateway, runs on the memory store"
fi
# Toxiproxy is built from source with Go: any Go will do (build_toxiproxy.sh).
if ! bash scripts/build_toxiproxy.sh --built && ! has go \
   && ! compgen -G "/usr/lib/go-1.*/bin/go" >/dev/null && [ ! -x /usr/local/go/bin/go ]; then
  want must golang-go "Toxiproxy is built with Go (Debian's 1.19 fetches the 1.23 it needs)"
fi
if ! bash scripts/build_toxiproxy.sh --built && ! has patch && ! has git; then
  want must patch "applies the lab's patch to Toxiproxy's source (or git, if present)"
fi
# Debian's own chromium: the browser tests drive it over the DevTools protocol,
# so no browser is downloaded from anywhere else. Without it those tests, and
# the seventh-tab scenario, are skipped (each saying why); the lab runs.
if ! has chromium; then
  if [ "$WITH_DEV" = 1 ]; then
    want optional chromium "the browser tests and the seventh-tab scenario skip without it" \
      --no-install-recommends
  else
    echo "note: chromium is not installed: the browser tests and the seventh-tab" \
         "scenario skip without it (\`make test\` installs it as root)" >&2
  fi
fi
if [ "${#apt_wanted[@]}" -gt 0 ] || [ "${#apt_wanted_norec[@]}" -gt 0 ]; then
  say "installing $(printf '%s ' "${apt_wanted[@]}" "${apt_wanted_norec[@]}")from Debian's packages"
  apt-get update -qq
  if [ "${#apt_wanted[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_wanted[@]}" >/dev/null
  fi
  if [ "${#apt_wanted_norec[@]}" -gt 0 ]; then
    # chromium's fonts: pages render without the recommends' extra fonts.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${apt_wanted_norec[@]}" fonts-liberation >/dev/null
  fi
fi
# Debian starts a system nginx on port 80 (and a redis on 6379) at install; the
# lab runs its own and never needs those, but leaves them alone.

lacking() {  # lacking PACKAGE: one the lab needs, and this run could not install
  local package
  for package in "${must[@]}"; do [ "$package" = "$1" ] && return 0; done
  return 1
}
# What stops the lab, said once more at the end, with the line to run.
finish() {
  if [ "${#optional[@]}" -gt 0 ]; then
    echo "left out (not root): ${optional[*]}; as root: sudo apt-get install -y ${optional[*]}" >&2
  fi
  if [ "${#must[@]}" -gt 0 ]; then
    echo "the lab cannot run without: ${must[*]}. Install it with:" \
         "sudo apt-get install -y ${must[*]}  (then run this again)" >&2
    exit 1
  fi
}

# --- the venv -------------------------------------------------------------------
if lacking python3-venv; then
  echo "skipping .venv and the Python packages: $PYTHON has no venv (python3-venv)" >&2
fi
# A new pyproject or lock is a new stamp: the venv is brought to it.
stamp=.venv/.installed-$(cat pyproject.toml requirements/*.lock | sha256sum | cut -c1-16)
# The stamp file lists the extras installed for this pyproject.toml, one a line.
has_extras() {
  [ -f "$stamp" ] || return 1
  local extra
  for extra in ${1//,/ }; do grep -qxF "$extra" "$stamp" || return 1; done
}
if ! lacking python3-venv && ! has_extras "$EXTRAS"; then
  # What this pyproject's venv already has stays (a `make test` after `make up`
  # adds the dev tools, it does not trade the lab's for them).
  wanted=$( { [ -f "$stamp" ] && cat "$stamp"; tr ',' '\n' <<<"$EXTRAS"; } | sort -u | paste -sd, -)
  # The smallest lock that holds every extra wanted, and the extras it holds.
  case ",$wanted," in
    *,dev,*) lock=dev covers=dev,lab,plot ;;
    *,plot,*) lock=plot covers=lab,plot ;;
    *) lock=lab covers=lab ;;
  esac
  # hf is not in these locks: left out, so the hf step below installs its own.
  wanted=$( { tr ',' '\n' <<<"$wanted"; tr ',' '\n' <<<"$covers"; } | grep -vx hf | sort -u \
            | paste -sd, -)
  say "creating .venv and installing requirements/$lock.lock, then the project (extras $wanted)"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q -r requirements/pip.lock  # pip and setuptools, pinned too
  .venv/bin/python -m pip install -q -r "requirements/$lock.lock"
  # The project built with pip.lock's setuptools, not a newest one build isolation
  # would fetch unpinned.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-* && tr ',' '\n' <<<"$wanted" > "$stamp"
fi
# The independent servers the check tests run against: with the dev tools only.
if [ "$WITH_DEV" = 1 ] && ! lacking python3-venv; then bash scripts/install_check_servers.sh; fi
if [ "${STREAMLAB_WITH_HF:-0}" = "1" ] && ! lacking python3-venv && ! has_extras hf; then
  say "installing the hf extra (torch + transformers, several GB: takes minutes)"
  started=$SECONDS
  # hf.lock is compiled within dev.lock: what the venv has keeps its versions.
  .venv/bin/python -m pip install -q -r requirements/hf.lock
  echo hf >> "$stamp"
  say "hf extra installed in $((SECONDS - started)) s"
fi

# --- Toxiproxy ---------------------------------------------------------------
# Built from the pinned module's source with the lab's patch (a control API that
# cannot wedge on a blocked reader): scripts/build_toxiproxy.sh says why.
# Any Go does: an older one fetches the Go 1.23 toolchain (the script says how).
if ! lacking golang-go && ! lacking patch; then
  TOXIPROXY_VERSION="$TOXIPROXY_VERSION" bash scripts/build_toxiproxy.sh
fi

# --- other edge proxies (docs/proxies.md) --------------------------------------
# HAProxy, Caddy and Traefik, only when asked: STREAMLAB_PROXIES=all (CI), or a
# space-separated list. `streamlab up --proxy X` installs X on first use.
if [ -n "${STREAMLAB_PROXIES:-}" ]; then
  if [ "$STREAMLAB_PROXIES" = "all" ]; then
    bash scripts/install_proxies.sh
  else
    # shellcheck disable=SC2086  # a list of names, split on purpose
    bash scripts/install_proxies.sh $STREAMLAB_PROXIES
  fi
fi

finish
