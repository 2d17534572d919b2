#!/usr/bin/env bash
# Installs what the lab needs, skipping what is already there:
#   - .venv/ with the project and the extras STREAMLAB_EXTRAS names (default
#     dev,lab,plot: the lab tool, the plots and the dev tools), from the
#     smallest lock under requirements/ that covers them (pinned, hashes
#     checked; scripts/lock.py, `make lock`), then the project itself with
#     `pip install --no-deps -e .`. `make up` asks for `lab` only, what the lab
#     runs; `make test` for all three. A venv that already has a superset of
#     the extras asked for is left as it is.
#   - nginx and redis-server from Debian's packages
#   - chromium from Debian's packages (for the browser test)
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
# A new pyproject or lock is a new stamp: the venv is brought to it.
stamp=.venv/.installed-$(cat pyproject.toml requirements/*.lock | sha256sum | cut -c1-16)
# The stamp file lists the extras installed for this pyproject.toml, one a line.
has_extras() {
  [ -f "$stamp" ] || return 1
  local extra
  for extra in ${1//,/ }; do grep -qxF "$extra" "$stamp" || return 1; done
}
if ! has_extras "$EXTRAS"; then
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
  .venv/bin/python -m pip install -q -r requirements/pip.lock  # pip itself, pinned too
  .venv/bin/python -m pip install -q -r "requirements/$lock.lock"
  .venv/bin/python -m pip install -q --no-deps -e .
  rm -f .venv/.installed-* && tr ',' '\n' <<<"$wanted" > "$stamp"
fi
# The independent servers the check tests run against: with the dev tools only.
case ",$EXTRAS," in *,dev,*) bash scripts/install_check_servers.sh ;; esac
if [ "${STREAMLAB_WITH_HF:-0}" = "1" ] && ! has_extras hf; then
  say "installing the hf extra (torch + transformers, several GB: takes minutes)"
  started=$SECONDS
  # hf.lock is compiled within dev.lock: what the venv has keeps its versions.
  .venv/bin/python -m pip install -q -r requirements/hf.lock
  echo hf >> "$stamp"
  say "hf extra installed in $((SECONDS - started)) s"
fi

# --- redis-server -------------------------------------------------------------
# The gateways' shared resume log when the lab runs replicas (docs/topology.md).
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing redis-server from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis-server is missing. Install it with: sudo apt-get install -y redis-server" >&2
    exit 1
  fi
fi

# --- nginx ------------------------------------------------------------------
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing nginx from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
  else
    echo "nginx is missing. Install it with: sudo apt-get install -y nginx-light" >&2
    exit 1
  fi
fi
# The HTTP/2 edge needs nginx's ssl and http_v2 modules. Debian 12's nginx-light
# is a transitional package that installs `nginx`, which has both; an older
# nginx-light or another build may lack them: then Debian's `nginx` package.
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
if ! "$nginx_bin" -V 2>&1 | grep -q -- --with-http_v2_module \
   || ! "$nginx_bin" -V 2>&1 | grep -q -- --with-http_ssl_module; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian's nginx (this one lacks the ssl or http_v2 module)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
  else
    echo "nginx lacks the ssl or http_v2 module (nginx -V); install Debian's" \
         "'nginx' package: sudo apt-get install -y nginx" >&2
    exit 1
  fi
fi
# Debian starts a system nginx on port 80 at install; the lab runs its own and
# never needs that one, but leaves it alone.

# --- chromium (the browser resume test) -----------------------------------------
# Debian's own package: the browser test drives it over the DevTools protocol,
# so no browser is downloaded from anywhere else. Without it that one test is
# skipped (with its reason), everything else runs.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    say "installing chromium from Debian's packages (browser resume test)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
  else
    echo "chromium is missing, so the browser test will be skipped." \
         "Install it with: sudo apt-get install -y chromium" >&2
  fi
fi

# --- Toxiproxy ---------------------------------------------------------------
# Built from the pinned module's source with the lab's patch (a control API that
# cannot wedge on a blocked reader): scripts/build_toxiproxy.sh says why.
TOXIPROXY_VERSION="$TOXIPROXY_VERSION" bash scripts/build_toxiproxy.sh

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
