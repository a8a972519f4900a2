"""Init-time probes: the library by find_spec, the model by files, no imports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lazyenc import EncoderManager
from lazyenc._loaders import resolve_device


@pytest.mark.parametrize(
    ("module", "extra", "missing"),
    [("sentence_transformers", "st", {"dense", "rerank", "sparse"}), ("spacy", "spacy", {"spacy"})],
)
def test_missing_library_is_unavailable_naming_the_extra(
    example_config: Path, monkeypatch: pytest.MonkeyPatch, module: str, extra: str, missing: set[str]
) -> None:
    """Without a backing library its encoders are unavailable naming the pip extra; the others stay idle."""
    monkeypatch.setitem(sys.modules, module, None)  # find_spec now reports it missing
    mgr = EncoderManager.from_toml(example_config)
    assert missing == {n for n in mgr if mgr[n].state == "unavailable"}
    assert {"idle"} == {mgr[n].state for n in mgr if n not in missing}
    for name in missing:
        assert f"pip install 'lazyenc[{extra}]'" in mgr[name].reason


def test_spacy_model_package_missing_is_unavailable(write_toml) -> None:  # type: ignore[no-untyped-def]
    """A spaCy pipeline package that is not installed is named in the reason."""
    path = write_toml("[encoders.nlp]\nkind = 'spacy'\nmodel = 'xx_no_such_pipeline'\n")
    proxy = EncoderManager.from_toml(path)["nlp"]
    assert ("unavailable", "spaCy model package 'xx_no_such_pipeline' is not installed") == (
        proxy.state,
        proxy.reason,
    )


def test_reset_probes_again(write_toml, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An encoder unavailable for a missing folder becomes idle after the folder appears and reset()."""
    path = write_toml("[encoders.nlp]\nkind = 'spacy'\nmodel = './pipeline'\n")
    mgr = EncoderManager.from_toml(path)
    assert "unavailable" == mgr["nlp"].state
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "config.cfg").write_text("[nlp]\n")
    mgr.reset("nlp")
    assert "idle" == mgr["nlp"].state


def test_auto_device_resolves_to_cpu_on_this_machine() -> None:
    """device = auto picks CUDA, then MPS, then CPU; spaCy stays on CPU; explicit devices pass through."""
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert expected == resolve_device("auto", kind="dense")
    assert "cpu" == resolve_device("auto", kind="spacy")
    assert "cuda:1" == resolve_device("cuda:1", kind="dense")
