#!/usr/bin/env bash
# Installs a real llama.cpp server for the `streamlab check` tests to run
# against (tests/integration/llama_server.py), into the lab's .venv:
#
#   llama-cpp-python[server]  llama.cpp's Python bindings and their
#                             OpenAI-compatible server (`python -m
#                             llama_cpp.server`); PyPI has only its sdist, so
#                             llama.cpp is compiled here, for the CPU
#   gguf                      writes the tests' tiny model (random weights, a
#                             tokenizer of its own): nothing comes from a hub
#
# Both, the server extra's packages and theirs come from
# requirements/llama-server.lock (compiled within dev.lock from
# requirements/llama-server.in, every package with its hashes): the sdist is
# hash-checked before it is built (pip cannot check the build tools its
# isolated build fetches), the wheel built from it is installed without
# dependencies, and everything else from the lock.
#
# The first run compiles llama.cpp (3.5 minutes on 2 cores) into a wheel kept
# under ${XDG_CACHE_HOME:-~/.cache}/streamlab/wheels; a later run installs that
# wheel in seconds, and one that finds both pinned versions installed does
# nothing. The build is portable across x86-64 CPUs with AVX2 (GGML_NATIVE=OFF:
# a cached wheel must not carry this CPU's extensions to another machine), and
# leaves out mtmd (the multimodal library, which the server loads only for
# image models). Not part of scripts/install.sh: without it the llama tests
# skip, saying how to install it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

LOCK=requirements/llama-server.lock
pinned() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$LOCK"; }
LLAMA_CPP_PYTHON_VERSION=$(pinned llama-cpp-python)
GGUF_VERSION=$(pinned gguf)
WHEELS="${XDG_CACHE_HOME:-$HOME/.cache}/streamlab/wheels"

if [ ! -x .venv/bin/python ]; then
  echo "no .venv: run scripts/install.sh first" >&2
  exit 1
fi
wanted=("llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" "gguf==$GGUF_VERSION")
# Already there at the pinned versions: nothing to build or ask the index.
if .venv/bin/python scripts/installed_at_pins.py "${wanted[@]}"; then
  exit 0
fi

# The lock split in two: llama-cpp-python's own entry (its sdist's hash), the rest.
split=$(mktemp -d)
trap 'rm -rf "$split"' EXIT
.venv/bin/python - "$LOCK" "$split" <<'PY'
import re, sys
from pathlib import Path
blocks = re.split(r"^(?=[A-Za-z0-9])", Path(sys.argv[1]).read_text(), flags=re.M)
mine = [b for b in blocks if b.startswith("llama-cpp-python==")]
Path(sys.argv[2], "llama-cpp-python.lock").write_text("".join(mine))
Path(sys.argv[2], "rest.lock").write_text("".join(b for b in blocks if b not in mine))
PY

mkdir -p "$WHEELS"
if ! compgen -G "$WHEELS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION-*.whl" >/dev/null; then
  echo "building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (compiles llama.cpp for the CPU:" \
       "minutes; the wheel is kept in $WHEELS)" >&2
  started=$SECONDS
  # Two compile jobs at most: the machine's other work keeps running.
  if ! CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF \
-DGGML_VULKAN=OFF -DGGML_BLAS=OFF" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
      .venv/bin/python -m pip wheel -q --no-deps --require-hashes --wheel-dir "$WHEELS" \
      -r "$split/llama-cpp-python.lock"; then
    echo "building llama-cpp-python failed: the llama server tests will skip" >&2
    exit 1
  fi
  echo "llama-cpp-python built in $((SECONDS - started)) s" >&2
fi
# The lock's other packages (the server extra's, gguf's; hashes checked), then
# the cached wheel, built from the checked sdist, without dependencies.
if ! .venv/bin/python -m pip install -q -r "$split/rest.lock" \
    || ! .venv/bin/python -m pip install -q --no-deps \
      "$(compgen -G "$WHEELS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION-*.whl" | head -1)"; then
  echo "installing ${wanted[*]} failed: the llama server tests will skip" >&2
  exit 1
fi
