"""The admin page in headless Chromium, served by a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
import uvicorn

from lazyenc import EncoderLoadError, EncoderManager
from lazyenc.admin import create_app
from lazyenc.testing import FakeLoader, make_settings

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not installed (apt-get install chromium chromium-driver; .ci/run installs it)",
    ),
]

EXPECTED = {
    "dense": "loaded",
    "rerank": "loading",
    "sparse": "disabled",
    "spacy": "unavailable",
    "spare": "idle",
}


@pytest.fixture
def server_url() -> Iterator[str]:
    """A uvicorn server in a thread, over a manager with one encoder in each state."""
    gate = threading.Event()
    kinds = {"dense": "dense", "rerank": "rerank", "sparse": "sparse", "spacy": "spacy", "spare": "dense"}
    mgr = EncoderManager(
        make_settings(kinds),
        loaders={
            "dense": FakeLoader(dimension=384),
            "rerank": FakeLoader(gate=gate),
            "sparse": FakeLoader(fail=RuntimeError("config.json: <unexpected> key")),
            "spacy": FakeLoader(
                available=False, reason="spaCy is not installed: pip install 'lazyenc[spacy]'"
            ),
            "spare": FakeLoader(),
        },
    )
    mgr["dense"].encode(["warm"])
    with pytest.raises(EncoderLoadError):
        mgr["sparse"].encode(["x"])
    building = threading.Thread(target=mgr["rerank"].predict, args=([("q", "d")],), daemon=True)
    building.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(create_app(mgr, token="t"), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        gate.set()
        building.join(30)
        mgr.close()


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120, check=True)


class _Rows(HTMLParser):
    """Collects data-name -> data-state of the component rows, and the text of each state badge."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, str] = {}
        self.badges: list[str] = []
        self._in_badge = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-name"):
            self.rows[str(a["data-name"])] = str(a.get("data-state"))
        self._in_badge = tag == "span" and a.get("class") == "badge"

    def handle_data(self, data: str) -> None:
        if self._in_badge:
            self.badges.append(data.split()[0])
            self._in_badge = False


def test_chromium_renders_a_row_and_the_state_of_every_encoder(server_url: str, tmp_path: Path) -> None:
    """Headless Chromium loads /admin and its DOM holds one row per encoder with its state."""
    dom = _chromium(tmp_path, "--dump-dom", f"{server_url}/admin").stdout
    rows = _Rows()
    rows.feed(dom)
    assert EXPECTED == rows.rows
    assert list(EXPECTED.values()) == rows.badges
    assert "&lt;unexpected&gt;" in dom  # the reason is text, not markup
    assert "lazyenc encoders" in dom


def test_chromium_takes_a_screenshot_of_the_page(server_url: str, tmp_path: Path) -> None:
    """The page renders to a non-empty PNG (kept in the test's tmp dir for a look)."""
    shot = tmp_path / "admin.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,600", f"{server_url}/admin")
    data = shot.read_bytes()
    assert b"\x89PNG\r\n\x1a\n" == data[:8]
    assert len(data) > 10_000
