"""The compose lab reads its services' settings from the env files compose
gives them (streamlab/lab/compose.py), so scenarios know the keepalives."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlab.lab.compose import ComposeLab, read_env_file
from streamlab.lab.topology import Ports


def test_env_files_are_read_like_compose_reads_them(tmp_path: Path) -> None:
    env = tmp_path / "gateway.env"
    env.write_text("# a comment\n\nSTREAMLAB_GATEWAY_ENGINE_KEEPALIVE_S=1\n"
                   "STREAMLAB_GATEWAY_API_KEYS=[\"a=b\"]\n")
    assert read_env_file(env) == {"STREAMLAB_GATEWAY_ENGINE_KEEPALIVE_S": "1",
                                  "STREAMLAB_GATEWAY_API_KEYS": '["a=b"]'}
    assert read_env_file(tmp_path / "missing.env") == {}


def test_the_compose_lab_takes_the_files_compose_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tmp_path / "engine.env"
    engine.write_text("STREAMLAB_ENGINE_KEEPALIVE_S=2\n")
    monkeypatch.setenv("STREAMLAB_ENGINE_ENV_FILE", str(engine))
    monkeypatch.delenv("STREAMLAB_GATEWAY_ENV_FILE", raising=False)
    lab = ComposeLab(Ports.load())
    assert lab.options.engine_env == {"STREAMLAB_ENGINE_KEEPALIVE_S": "2"}
    assert lab.options.gateway_env == {}  # services/gateway/compose.env sets nothing
