"""The admin panel on the real packaged models of config.example.toml."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from lazyenc import EncoderManager
from lazyenc.admin import create_app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.toml"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reads_import_no_ml_library_on_the_real_config() -> None:
    """In a fresh process, every GET on the example config imports neither torch nor any model library."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from starlette.testclient import TestClient
        from lazyenc import EncoderManager
        from lazyenc.admin import create_app
        mgr = EncoderManager.from_toml({str(EXAMPLE)!r})
        paths = ["/admin", "/admin/components", "/admin/health", "/admin/ready", "/metrics"]
        with TestClient(create_app(mgr)) as client:
            codes = [client.get(p).status_code for p in paths]
            doc = client.get("/admin/components").json()
        heavy = ["torch", "transformers", "sentence_transformers", "spacy", "numpy"]
        print(json.dumps({{
            "codes": codes,
            "imported": [m for m in heavy if m in sys.modules],
            "states": {{c["name"]: c["state"] for c in doc["components"]}},
            "torch_imported": doc["process"]["torch_imported"],
            "cuda": doc["process"]["cuda"],
        }}))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=_env(), capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert {
        "codes": [200] * 5,
        "imported": [],
        "states": {"dense": "idle", "rerank": "idle", "sparse": "idle", "spacy": "idle"},
        "torch_imported": False,
        "cuda": None,
    } == result


@pytest.mark.real
def test_after_a_real_dense_call_the_panel_shows_it_loaded_and_the_others_idle() -> None:
    """One real MiniLM encode through the manager shows up as dense loaded, with build time and RSS delta."""
    with EncoderManager.from_toml(EXAMPLE) as mgr:
        vectors = mgr["dense"].encode(["lazy loading pays only for what is used"])
        with TestClient(create_app(mgr)) as client:
            doc = client.get("/admin/components").json()
            page = client.get("/admin").text
    components = {c["name"]: c for c in doc["components"]}
    assert 384 == len(vectors[0])
    assert {"dense": "loaded", "rerank": "idle", "sparse": "idle", "spacy": "idle"} == {
        n: c["state"] for n, c in components.items()
    }
    dense = components["dense"]
    assert (True, 1, 0, 384) == (dense["loaded"], dense["calls"], dense["errors"], dense["dimension"])
    assert dense["load_seconds"] > 0
    assert dense["rss_delta_bytes"] > 0
    assert True is doc["process"]["torch_imported"]
    assert isinstance(doc["process"]["cuda"], list)
    assert 'data-name="dense" data-state="loaded"' in page


@pytest.mark.real
def test_lazyenc_admin_serves_loads_in_the_background_and_exits_cleanly(tmp_path: Path) -> None:
    """`lazyenc admin` answers during a real build started by POST load and shuts down cleanly on SIGTERM."""
    config = tmp_path / "lazyenc.toml"
    config.write_text(EXAMPLE.read_text() + '\n[admin]\ntoken_env = "LAZYENC_TEST_ADMIN_TOKEN"\n')
    port = _free_port()
    env = {**_env(), "LAZYENC_TEST_ADMIN_TOKEN": "t0ken"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lazyenc", "admin", "--config", str(config), "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/admin/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the admin server did not start"
                time.sleep(0.1)
            accepted = client.post("/admin/components/dense/load", headers={"Authorization": "Bearer t0ken"})
            seen = set()
            deadline = time.monotonic() + 120
            while (state := _dense_state(client)) != "loaded":
                seen.add(state)
                assert state in ("idle", "loading"), state
                assert time.monotonic() < deadline, "the build did not finish"
                time.sleep(0.05)
            doc = client.get("/admin/components").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert 202 == accepted.status_code
    assert "loading" in seen
    assert {"dense": "loaded", "rerank": "idle", "sparse": "idle", "spacy": "idle"} == {
        c["name"]: c["state"] for c in doc["components"]
    }
    # uvicorn re-raises SIGTERM after its graceful shutdown, so -SIGTERM is the clean exit.
    assert proc.returncode in (0, -signal.SIGTERM), stderr
    assert "Application shutdown complete" in stderr  # the lifespan ran: the manager was closed
    assert "Traceback" not in stderr


def _dense_state(client: httpx.Client) -> str:
    doc = client.get("/admin/components").json()
    return str(next(c["state"] for c in doc["components"] if c["name"] == "dense"))
