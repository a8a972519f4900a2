"""Remote proxies without a server: no network at init, unreachable servers, local decode."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import lazyenc
from lazyenc._proxy import proxy_class
from lazyenc._remote import base_url
from tests._server_helpers import free_port


def remote_manager(
    url: str, *, environ: dict[str, str] | None = None, **extra: str
) -> lazyenc.EncoderManager:
    lines = "".join(f'{k} = "{v}"\n' for k, v in extra.items())
    settings = lazyenc.parse_config(f'[encoders.r]\nkind = "remote"\nurl = "{url}"\nmodel = "dense"\n{lines}')
    return lazyenc.EncoderManager(settings, environ=environ or {})


def test_kind_remote_builds_a_remote_proxy_that_is_an_encoder() -> None:
    """The registry maps kind 'remote' to RemoteProxy, which satisfies the Encoder protocol."""
    with remote_manager("http://127.0.0.1:9") as mgr:
        proxy = mgr["r"]
    assert (lazyenc.RemoteProxy, True) == (proxy_class("remote"), isinstance(proxy, lazyenc.Encoder))


def test_building_a_manager_and_its_repr_make_no_network_call() -> None:
    """A listening socket sees no connection from manager init or repr (state is asked lazily)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with remote_manager(url) as mgr:
            text = repr(mgr["r"])
            with pytest.raises(BlockingIOError):
                listener.accept()
    assert "state=unknown" in text


def test_an_unreachable_server_reads_as_unavailable_with_the_reason() -> None:
    """state and status() of a proxy whose server is down say unavailable and why."""
    url = f"http://127.0.0.1:{free_port()}"
    with remote_manager(url) as mgr:
        status = mgr.status()[0]
        state = mgr["r"].state
    assert ("unavailable", "unavailable", "remote") == (state, status.state, status.kind)
    assert f"cannot reach the lazyenc server at {url}" in status.reason


def test_calling_an_unreachable_server_raises_encoder_unavailable() -> None:
    """After the connection retries, a call raises EncoderUnavailableError naming the URL."""
    url = f"http://127.0.0.1:{free_port()}"
    with remote_manager(url) as mgr, pytest.raises(lazyenc.EncoderUnavailableError, match="cannot reach"):
        mgr["r"].encode(["x"])


def test_an_unset_api_key_variable_makes_the_proxy_unavailable() -> None:
    """api_key_env naming an unset variable is caught by the probe, without touching the network."""
    with remote_manager("http://127.0.0.1:9", api_key_env="LAZYENC_NO_SUCH_KEY") as mgr:
        proxy = mgr["r"]
        assert ("unavailable", True) == (proxy.state, "LAZYENC_NO_SUCH_KEY" in proxy.reason)
        with pytest.raises(lazyenc.EncoderUnavailableError, match="LAZYENC_NO_SUCH_KEY"):
            proxy.encode("x")


def test_a_closed_remote_proxy_refuses_calls() -> None:
    """After the manager closes, a remote call raises EncoderClosedError."""
    mgr = remote_manager("http://127.0.0.1:9")
    mgr.close()
    with pytest.raises(lazyenc.EncoderClosedError):
        mgr["r"].encode("x")


@pytest.mark.parametrize("url", ["http://h:8700", "http://h:8700/", "http://h:8700/v1", "http://h:8700/v1/"])
def test_url_may_name_the_server_root_or_its_v1(url: str) -> None:
    """The configured url is normalised to the server root."""
    assert "http://h:8700" == base_url(url)


def test_decode_works_locally_on_remote_sparse_rows() -> None:
    """decode sorts a row's (token, weight) pairs, heaviest first; a list gives a list of lists."""
    row: dict[str, Any] = {"indices": [3, 7, 9], "values": [0.5, 2.0, 1.0], "tokens": ["a", "b", "c"]}
    with remote_manager("http://127.0.0.1:9") as mgr:
        proxy = mgr["r"]
        assert [("b", 2.0), ("c", 1.0)] == proxy.decode(row, top_k=2)
        assert [[("b", 2.0)], [("b", 2.0)]] == proxy.decode([row, row], top_k=1)
        with pytest.raises(TypeError, match="indices"):
            proxy.decode([0.0, 1.0])


def test_a_stale_status_answers_at_once_and_refreshes_in_the_background(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its cache time, status() returns the last answer while a thread asks a server that hangs."""
    import threading

    from lazyenc import _remote
    from lazyenc._remote import _Info

    monkeypatch.setattr(_remote, "STATUS_TIMEOUT_S", 5.0)  # the silent server holds the refresh that long

    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with remote_manager(url) as mgr:
            proxy = mgr["r"]
            proxy._info, proxy._info_at = _Info("loaded", kind="dense", dimension=384), 0.0  # long stale
            assert ("loaded", 384) == (proxy.state, proxy.status().dimension)
            refreshing = [t for t in threading.enumerate() if t.name == "lazyenc-remote-status-r"]
            assert 1 == len(refreshing)  # still waiting on the silent server: status() did not
            refreshing[0].join(30)  # a guard against a hang, not a timing check
            assert "unavailable" == proxy.state
