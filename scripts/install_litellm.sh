#!/usr/bin/env bash
# Installs LiteLLM's proxy (an AI gateway people put between clients and vLLM)
# into a venv of its own, .tools/litellm/, for the `streamlab check` test that
# puts it in front of the lab's gateway (tests/integration/test_check_litellm.py).
#
# A venv of its own: litellm[proxy] brings ~500 MB and pins its own FastAPI,
# pydantic and httpx, which must not move the lab's: requirements/litellm.lock,
# compiled alone from requirements/litellm.in (every package with its hashes).
# 1.80.0: the newest whose `proxy` extra installs from PyPI here (from 1.110 it
# needs `litellm-proxy`, which is not published). Not part of scripts/install.sh
# or CI: without it the test skips, saying how to install it (`make
# test-check-servers` runs it).
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCK=requirements/litellm.lock
LITELLM_VERSION=$(sed -n 's/^litellm==\([^ ]*\).*/\1/p' "$LOCK")
VENV=.tools/litellm
if [ -x "$VENV/bin/litellm" ] && "$VENV/bin/python" -c "
import sys
from importlib.metadata import version
sys.exit(version('litellm') != '$LITELLM_VERSION')"; then
  exit 0
fi
python3 -m venv "$VENV"
echo "installing litellm[proxy]==$LITELLM_VERSION into $VENV (~500 MB)" >&2
"$VENV/bin/pip" install -q -r requirements/litellm.lock
