"""Which model the lab's engine runs: `streamlab up --backend ...` → the engine's settings.

The engine reads its settings from its environment (services/engine/settings.py),
so choosing a backend is choosing environment variables for the engine process
(and the model name the gateway reports). An API key is passed by value in
the engine's environment, read from the variable the user names: it never
appears on a command line or in the run directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from streamlab.errors import StreamlabError

BackendName = Literal["fake", "hf", "openai"]

# A real model can take minutes to load (and the engine answers its health
# check only once it has); the fake model starts in a second.
HF_READY_TIMEOUT_S = 900.0


class BackendChoiceError(StreamlabError, ValueError):
    """A backend option is missing or wrong; the message names the option."""


@dataclass(frozen=True)
class BackendChoice:
    engine_env: dict[str, str] = field(default_factory=dict)
    gateway_env: dict[str, str] = field(default_factory=dict)
    engine_ready_timeout_s: float | None = None  # None: the lab's default


def choose(
    backend: BackendName,
    *,
    model: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> BackendChoice:
    if backend == "fake":
        if model or base_url:
            raise BackendChoiceError("--model and --base-url need --backend hf or openai")
        return BackendChoice()
    if backend == "hf":
        if not model:
            raise BackendChoiceError(
                "--backend hf needs --model: a directory written by save_pretrained "
                "(or a hub name, where the hub is reachable)")
        if base_url or api_key_env:
            raise BackendChoiceError("--base-url and --api-key-env are for --backend openai")
        path = Path(model).expanduser()
        # A local directory is passed absolute: the engine runs from the repo root.
        source = str(path.resolve()) if path.exists() else model
        env = {"STREAMLAB_ENGINE_BACKEND": "hf", "STREAMLAB_HF_MODEL": source}
        if device:
            env["STREAMLAB_HF_DEVICE"] = device
        if dtype:
            env["STREAMLAB_HF_DTYPE"] = dtype
        return BackendChoice(env, {"STREAMLAB_GATEWAY_MODEL_NAME": path.name or model},
                             HF_READY_TIMEOUT_S)
    if not base_url:
        raise BackendChoiceError(
            "--backend openai needs --base-url, e.g. http://127.0.0.1:8000/v1 (vLLM)")
    if device or dtype:
        raise BackendChoiceError("--device and --dtype are for --backend hf")
    env = {"STREAMLAB_ENGINE_BACKEND": "openai", "STREAMLAB_OPENAI_BASE_URL": base_url}
    if model:
        env["STREAMLAB_OPENAI_MODEL"] = model
    if api_key_env:
        key = environ.get(api_key_env)
        if not key:
            raise BackendChoiceError(f"--api-key-env {api_key_env}: that variable is not set")
        env["STREAMLAB_OPENAI_API_KEY"] = key
    return BackendChoice(env, {"STREAMLAB_GATEWAY_MODEL_NAME": model or "upstream"})
