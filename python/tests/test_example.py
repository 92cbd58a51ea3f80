"""The example in python/examples runs and its own check passes."""

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_attention_example():
    r = subprocess.run([sys.executable, str(EXAMPLES / "attention.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "refused as expected" in r.stdout
