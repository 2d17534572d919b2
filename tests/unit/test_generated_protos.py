from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_grpc_code_matches_the_protos() -> None:
    """Fails when someone edits protos/ without running `make protos` (or edits the output)."""
    result = subprocess.run([sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
