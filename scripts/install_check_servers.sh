#!/usr/bin/env bash
# Installs the OpenAI-compatible servers nobody here wrote that `streamlab
# check` is tested against (tests/integration/test_check_independent.py), into
# the lab's .venv: the `check-servers` extra of pyproject.toml, pinned there,
# installed from requirements/check-servers.lock (that extra and what it
# brings, with hashes, compiled within dev.lock: the venv's versions stay).
#
#   llm-mock-api  a mock LLM server (chat completions, Responses), pure Python,
#                 no model weights; its dependencies (FastAPI, uvicorn,
#                 pydantic) are the lab's own, plus json5: two small wheels.
#
# The lock rather than `pip install -e '.[check-servers]'`, which would rebuild
# the editable project for two wheels and check no hash. scripts/install.sh
# calls this when it installs the dev tools (the tests need it, the lab does
# not); without it those tests skip, saying how to install it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  echo "no .venv: run scripts/install.sh first" >&2
  exit 1
fi
mapfile -t wanted < <(.venv/bin/python -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"]["check-servers"]))')
# Already there at the pinned versions: nothing to ask the index.
if .venv/bin/python scripts/installed_at_pins.py "${wanted[@]}"; then
  exit 0
fi
if ! .venv/bin/python -m pip install -q -r requirements/check-servers.lock; then
  echo "installing ${wanted[*]} failed: the independent-server check tests will skip" >&2
  exit 1
fi
