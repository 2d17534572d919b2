#!/usr/bin/env bash
# The wheel as someone outside the clone meets it (CI runs it after `make test`;
# about a minute on 2 cores):
#
#   1. `python -m build`: the sdist, then the wheel built from it (so the sdist
#      carries everything the wheel needs); `twine check --strict` on both
#   2. a fresh virtualenv in a temporary directory: the wheel with its `lab`
#      extra, and pytest (the versions requirements/dev.lock pins)
#   3. from a directory outside the clone, as a user with empty state and cache
#      directories (XDG_STATE_HOME, XDG_CACHE_HOME), nothing of the clone used:
#        streamlab --version
#        streamlab install toxiproxy   the patched build, into the user cache
#        streamlab up                  on free ports; the run dir: the user's state dir
#        streamlab check GATEWAY       with no Toxiproxy to find: through its own
#                                      asyncio hop, and every check passes
#        pytest --fixtures             lists the plugin's four fixtures
#        docs/check.md's example plugin test, against that lab: the plugin finds
#                                      it in the same run dir as the CLI
#        streamlab scenario matrix --proxy-config, with a config nginx refuses:
#                                      nginx's own words, exit 1, no traceback
#        streamlab down
#
# Needs what `make test` installed: .venv (build, twine), nginx, Go.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON="${PYTHON:-python3}"
started=$SECONDS

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/streamlab-wheel.XXXXXX")
VENV="$WORK/venv"
USER_DIR="$WORK/user"  # the user's own project directory: no clone above it
mkdir -p "$USER_DIR"

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -f "$WORK/state/streamlab/state.json" ]; then
    (cd "$USER_DIR" && XDG_STATE_HOME="$WORK/state" "$VENV/bin/streamlab" down >/dev/null 2>&1)
  fi
  if [ "$rc" -ne 0 ] && [ -d "$WORK/state/streamlab/logs" ]; then
    say "failed (exit $rc): the lab's last log lines"
    tail -n 15 "$WORK"/state/streamlab/logs/*.log >&2
  fi
  rm -rf "$WORK"
  say "wheel check finished in $((SECONDS - started)) s (exit $rc)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. build and check ---------------------------------------------------------------
say "building the sdist, then the wheel from it"
# Without build isolation: the venv's setuptools (dev.lock's, hashed), not the
# newest one an isolated build would fetch from PyPI unpinned.
.venv/bin/python -m build --no-isolation --outdir "$WORK/dist" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -n 30 "$WORK/build.log" >&2; exit 1; }
.venv/bin/twine check --strict "$WORK"/dist/*
wheel=$(ls "$WORK"/dist/streamlab-*.whl)
# What the installed lab reads from the package: a unit test checks each is
# found there (tests/unit/streamlab/test_paths.py); here, that the wheel has them.
.venv/bin/python - "$wheel" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
needed = ["streamlab/_data/lab.env", "streamlab/_data/proxies/nginx/nginx.conf.template",
          "streamlab/_data/proxies/toxiproxy/patches/interruptible-sends.patch",
          "streamlab/_data/proxies/jaeger/jaeger.yaml",
          "streamlab/console/static/index.html", "streamlab/console/static/console.js",
          "services/gateway/static/demo.html"]
missing = [name for name in needed if name not in names]
sys.exit(f"the wheel lacks: {', '.join(missing)}" if missing else 0)
EOF

# ---- 2. a fresh virtualenv ----------------------------------------------------------
say "installing it into a fresh virtualenv ($VENV)"
"$PYTHON" -m venv "$VENV"
# dev.lock's versions (its hashes left out: they pin files, a constraint pins versions).
sed -n 's/^\([A-Za-z0-9][^ ]*==[^ \\]*\)\( ;[^\\]*\)\?.*$/\1\2/p' requirements/dev.lock \
  >"$WORK/constraints.txt"
"$VENV/bin/pip" install -q --disable-pip-version-check -c "$WORK/constraints.txt" \
  "$wheel[lab]" pytest

# ---- 3. a user outside the clone ----------------------------------------------------
# Nothing of this shell's lab settings, nor of the clone (cwd, PATH's .venv).
while IFS= read -r name; do unset "$name"; done < <(compgen -e | grep '^STREAMLAB_' || true)
# Go's own caches stay this machine's (moving XDG_CACHE_HOME would move its build cache).
if command -v go >/dev/null 2>&1; then
  GOCACHE=$(go env GOCACHE) GOMODCACHE=$(go env GOMODCACHE)
  export GOCACHE GOMODCACHE
fi
export XDG_STATE_HOME="$WORK/state" XDG_CACHE_HOME="$WORK/cache"
cd "$USER_DIR"
streamlab() { "$VENV/bin/streamlab" "$@"; }

say "streamlab --version"
streamlab --version

say "streamlab install toxiproxy (into $XDG_CACHE_HOME/streamlab/bin)"
streamlab install toxiproxy

# Free ports for every listener of the lab (held while picked, then let go).
"$VENV/bin/python" - >"$WORK/ports.env" <<'EOF'
import socket
from streamlab.lab.topology import Ports
held = []
for name in (n for n in Ports.model_fields if n.endswith("_port")):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
    print(f"STREAMLAB_{name.upper()}={s.getsockname()[1]}")
EOF
set -a; . "$WORK/ports.env"; set +a

say "streamlab up (run dir: the user's state directory)"
# The gateway's heartbeat within the check's short idle cut below.
STREAMLAB_GATEWAY_HEARTBEAT_S=0.5 streamlab up >/dev/null
[ -f "$XDG_STATE_HOME/streamlab/state.json" ] \
  || { echo "streamlab up left no state in $XDG_STATE_HOME/streamlab" >&2; exit 1; }

say "streamlab check against the lab's gateway, with no Toxiproxy to find"
# An empty cache (and, should this machine have one on PATH, an empty directory
# named outright): the check's hop is its own asyncio relay.
no_toxiproxy=(XDG_CACHE_HOME="$WORK/no-cache")
if command -v toxiproxy-server >/dev/null 2>&1; then
  no_toxiproxy+=(STREAMLAB_TOXIPROXY_DIR="$WORK/no-cache")
fi
env "${no_toxiproxy[@]}" COLUMNS=300 "$VENV/bin/streamlab" check \
  "http://127.0.0.1:$STREAMLAB_GATEWAY_PORT/v1" \
  --metrics-url "http://127.0.0.1:$STREAMLAB_ENGINE_METRICS_PORT/metrics" \
  --silence-s 3 --idle-cut-s 1.5 >"$WORK/check.out" 2>"$WORK/check.err" \
  || { cat "$WORK/check.out" "$WORK/check.err" >&2; exit 1; }
head -n 1 "$WORK/check.out"
grep -E '^(pass|fail|n/a|error) ' "$WORK/check.out"
if ! grep -q "through asyncio relay" "$WORK/check.out" \
   || grep -qE '^(fail|n/a|error) ' "$WORK/check.out" \
   || ! grep -qE '^pass ' "$WORK/check.out"; then
  echo "expected every check to pass through the check's own asyncio hop" >&2
  cat "$WORK/check.err" >&2
  exit 1
fi

say "pytest --fixtures lists the plugin's fixtures"
"$VENV/bin/pytest" -p no:cacheprovider --fixtures >"$WORK/fixtures.out"
for fixture in streamlab_lab streamlab_edge_url streamlab_toxics streamlab_engine_record; do
  grep -E "^$fixture( |$)" "$WORK/fixtures.out" \
    || { echo "pytest --fixtures does not list $fixture" >&2; exit 1; }
done

say "docs/check.md's example plugin test, against the lab streamlab up started"
"$PYTHON" - "$ROOT/docs/check.md" >"$USER_DIR/test_docs_example.py" <<'EOF'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
section = text[text.index("## In your own test suite: the pytest plugin"):]
print(re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1))
EOF
cat >"$USER_DIR/test_same_run_dir.py" <<'EOF'
import os
from pathlib import Path


def test_the_plugin_finds_the_lab_streamlab_up_started(streamlab_lab):
    assert streamlab_lab.run_dir == Path(os.environ["XDG_STATE_HOME"]) / "streamlab"
EOF
"$VENV/bin/pytest" -p no:cacheprovider -q test_docs_example.py test_same_run_dir.py

say "streamlab scenario matrix --proxy-config with a config nginx refuses"
# The lab of its own never comes up: nginx's own words are shown, literally.
printf 'events {}\nhttp { server { listen ${STREAMLAB_LISTEN}; location / { proxy_buffering maybe; } } }\n' \
  >"$USER_DIR/refused.conf"
set +e
COLUMNS=300 "$VENV/bin/streamlab" scenario matrix --proxy nginx --proxy-config refused.conf \
  --probe reload >"$WORK/matrix.out" 2>&1
rc=$?
set -e
if [ "$rc" -ne 1 ] || ! grep -qF '[emerg] invalid value "maybe"' "$WORK/matrix.out" \
   || grep -q Traceback "$WORK/matrix.out"; then
  echo "expected exit 1 and nginx's own words (exit $rc):" >&2
  cat "$WORK/matrix.out" >&2
  exit 1
fi
grep -m1 -F '[emerg]' "$WORK/matrix.out"

say "streamlab down"
streamlab down
