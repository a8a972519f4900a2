"""Importing the server and building remote proxies stays light: no ML or web library at import."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests._server_helpers import child_env

HEAVY = ["httpx", "numpy", "starlette", "uvicorn", "torch", "sentence_transformers", "asyncio"]


def test_importing_the_server_and_building_remote_proxies_imports_nothing_heavy() -> None:
    """`import lazyenc.server` and a manager of remote encoders load none of the heavy modules."""
    script = textwrap.dedent(
        f"""
        import json, sys
        import lazyenc, lazyenc.server
        toml = '[encoders.r]\\nkind = "remote"\\nurl = "http://127.0.0.1:9"\\nmodel = "dense"\\n'
        mgr = lazyenc.EncoderManager(lazyenc.parse_config(toml))
        repr(mgr["r"])
        print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, check=True
    )
    assert [] == json.loads(out.stdout)
