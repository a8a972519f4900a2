"""`import lazyenc` and a manager built from TOML import no heavy library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "sentence_transformers", "spacy", "numpy", "starlette", "uvicorn", "httpx")


def run_fresh(code: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_import_and_status_import_no_heavy_module(example_config: Path) -> None:
    """After import, from_toml(config.example.toml) and status(), no ML library is loaded."""
    code = f"""
import json, sys, lazyenc
mgr = lazyenc.EncoderManager.from_toml({str(example_config)!r})
states = [s.state for s in mgr.status()]
print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], "states": states}}))
"""
    result = run_fresh(code)
    assert [] == result["heavy"]
    assert ["idle", "idle", "idle", "idle"] == result["states"]


def test_repr_and_peek_import_no_heavy_module(example_config: Path) -> None:
    """repr(), peek(), `in` and iteration never build or import anything heavy."""
    code = f"""
import json, sys, lazyenc
mgr = lazyenc.EncoderManager.from_toml({str(example_config)!r})
reprs = [repr(mgr[n]) for n in mgr] + [repr(mgr)]
peeks = [mgr[n].peek() for n in mgr]
print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], "peeks": peeks}}))
"""
    result = run_fresh(code)
    assert [] == result["heavy"]
    assert [None, None, None, None] == result["peeks"]
