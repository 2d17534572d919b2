"""Fixtures for the transformers backend: a tiny model built here, and a lab on it.

The hf extra (torch, transformers) is optional. Without it these tests skip and
say how to install it, unless STREAMLAB_WITH_HF=1 (CI sets it): then a missing
torch is a failure, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamlab.lab.local import Lab, LabOptions
from tests.integration.conftest import TEST_HEARTBEAT_S, free_lab_ports

HF_MISSING = ("the hf extra (torch, transformers) is not installed: "
              "STREAMLAB_WITH_HF=1 bash scripts/install.sh")
# Long enough to cancel mid-way on any machine; the tiny model's context is 4096.
LONG_ANSWER = 3000


def require_hf() -> None:
    if all(importlib.util.find_spec(m) for m in ("torch", "transformers", "tokenizers")):
        return
    if os.environ.get("STREAMLAB_WITH_HF") == "1":
        pytest.fail(f"STREAMLAB_WITH_HF=1 but {HF_MISSING}")
    pytest.skip(HF_MISSING)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights and a byte-level BPE trained here, saved with save_pretrained."""
    require_hf()
    from services.engine.random_model import build

    return build(tmp_path_factory.mktemp("models") / "tiny-llama", size="tiny")


def hf_engine_env(model_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "STREAMLAB_ENGINE_BACKEND": "hf",
        "STREAMLAB_HF_MODEL": str(model_dir),
        # Decode to max_tokens: a random model may say end-of-sequence at any step.
        "STREAMLAB_HF_IGNORE_EOS": "true",
        # Two decode together; the engine queues what the batch cannot take.
        "STREAMLAB_HF_MAX_BATCH": "2",
        "STREAMLAB_ENGINE_MAX_QUEUED_GENERATIONS": "2",
        # Two cores shared by everyone's tests: one torch thread is enough for 32 wide.
        "STREAMLAB_HF_CPU_THREADS": "1",
        **extra,
    }


@pytest.fixture(scope="session")
def hf_lab(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The whole chain (edge → nginx → gateway → engine) with the engine on the tiny model."""
    ports = free_lab_ports()
    options = LabOptions(
        run_dir=tmp_path_factory.mktemp("hf-lab"),
        engine_env=hf_engine_env(tiny_model_dir),
        gateway_env={"STREAMLAB_GATEWAY_HEARTBEAT_S": str(TEST_HEARTBEAT_S),
                     "STREAMLAB_GATEWAY_MODEL_NAME": "tiny-llama"},
        # Importing torch on a busy two-core machine takes a while.
        engine_ready_timeout_s=180.0,
    )
    lab = Lab(ports, options)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()
