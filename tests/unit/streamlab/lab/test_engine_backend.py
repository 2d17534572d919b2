"""`streamlab up --backend ...` options → the engine's and gateway's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.engine.settings import EngineSettings
from streamlab.lab.engine_backend import BackendChoiceError, choose


def test_the_fake_model_needs_nothing() -> None:
    choice = choose("fake")
    assert choice.engine_env == {}
    assert choice.engine_ready_timeout_s is None


def test_hf_passes_an_absolute_model_directory_and_waits_for_the_load(tmp_path: Path) -> None:
    model = tmp_path / "my-model"
    model.mkdir()
    choice = choose("hf", model=str(model), device="cuda", dtype="bfloat16")
    assert choice.engine_env == {
        "STREAMLAB_ENGINE_BACKEND": "hf", "STREAMLAB_HF_MODEL": str(model.resolve()),
        "STREAMLAB_HF_DEVICE": "cuda", "STREAMLAB_HF_DTYPE": "bfloat16",
    }
    assert choice.gateway_env == {"STREAMLAB_GATEWAY_MODEL_NAME": "my-model"}
    assert choice.engine_ready_timeout_s is not None
    assert choice.engine_ready_timeout_s >= 300


def test_the_engine_reads_what_the_cli_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    choice = choose("openai", base_url="http://127.0.0.1:9/v1", model="llama3",
                    api_key_env="MY_KEY", environ={"MY_KEY": "sk-test"})
    for name, value in choice.engine_env.items():
        monkeypatch.setenv(name, value)
    settings = EngineSettings()
    assert settings.backend == "openai"
    assert settings.openai.base_url == "http://127.0.0.1:9/v1"
    assert settings.openai.model == "llama3"
    assert settings.openai.api_key is not None
    assert settings.openai.api_key.get_secret_value() == "sk-test"


@pytest.mark.parametrize(("backend", "options", "names"), [
    ("hf", {}, "--model"),
    ("openai", {}, "--base-url"),
    ("openai", {"base_url": "http://x/v1", "api_key_env": "UNSET_VAR"}, "UNSET_VAR"),
    ("openai", {"base_url": "http://x/v1", "device": "cuda"}, "--device"),
    ("hf", {"model": "m", "base_url": "http://x/v1"}, "--base-url"),
    ("fake", {"model": "m"}, "--model"),
])
def test_missing_or_misplaced_options_are_named(
    backend: str, options: dict[str, str], names: str
) -> None:
    with pytest.raises(BackendChoiceError, match=names):
        choose(backend, environ={}, **options)  # type: ignore[arg-type]
