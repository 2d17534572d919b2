from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Property tests draw anew on every local run (more inputs over time), but CI
# (CI=true) replays one fixed set, so a red run can be replayed as it was;
# HYPOTHESIS_PROFILE picks either explicitly. print_blob: a failure prints the
# `@reproduce_failure` line that replays it anywhere.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get(
    "HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI", "").lower() in ("1", "true") else "dev"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
