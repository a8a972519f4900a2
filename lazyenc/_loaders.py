"""Loaders per kind: the only code that imports sentence-transformers or spaCy.

A loader has two halves. ``probe`` runs at manager init and must stay cheap
(``find_spec`` and files on disk). ``build`` runs on first use, under the
proxy's build lock, and is where the heavy imports happen.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ._config import EncoderSettings
from ._log import log
from ._probe import Probe, find_library, model_metadata, package_dir, resolve_model

__all__ = ["Loader", "SentenceTransformersLoader", "SpacyLoader", "default_loader", "resolve_device"]


@runtime_checkable
class Loader(Protocol):
    """Probes and builds the model of one kind."""

    def probe(self, settings: EncoderSettings, environ: Mapping[str, str]) -> Probe:
        """Whether the model can be built here, from files on disk only."""
        ...

    def build(self, settings: EncoderSettings, *, device: str, probe: Probe) -> Any:
        """Build the model on ``device`` (already resolved)."""
        ...


def resolve_device(requested: str, *, kind: str) -> str:
    """Turn 'auto' into cuda, mps or cpu; called at build time only, never at init."""
    if requested != "auto":
        return requested
    if kind == "spacy":
        # spaCy's GPU path needs cupy; its CPU pipelines never import torch.
        return "cpu"
    import torch

    if torch.cuda.is_available():
        chosen = "cuda"
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        chosen = "mps"
    else:
        chosen = "cpu"
    log.info("device auto resolved to %s", chosen)
    return chosen


class SentenceTransformersLoader:
    """Dense (SentenceTransformer), rerank (CrossEncoder) and sparse (SparseEncoder)."""

    _CLASSES = {"dense": "SentenceTransformer", "rerank": "CrossEncoder", "sparse": "SparseEncoder"}

    def __init__(self, kind: str) -> None:
        if kind not in self._CLASSES:
            raise ValueError(f"no sentence-transformers class for kind {kind!r}")
        self.kind = kind

    def __repr__(self) -> str:
        return f"SentenceTransformersLoader({self.kind!r})"

    def probe(self, settings: EncoderSettings, environ: Mapping[str, str]) -> Probe:
        missing = find_library("sentence_transformers", "st", "sentence-transformers")
        if missing:
            return Probe(False, missing)
        folder, reason = resolve_model(settings.model, base_dir=settings.base_dir, environ=environ)
        if reason:
            return Probe(False, reason)
        if folder is None:  # a hub id to download at build time
            return Probe(True)
        if not os.path.isfile(os.path.join(folder, "config.json")):
            return Probe(False, f"model folder {folder!r} has no config.json")
        return Probe(True, path=folder, **model_metadata(folder, self.kind, settings.options))

    def build(self, settings: EncoderSettings, *, device: str, probe: Probe) -> Any:
        import sentence_transformers

        cls = getattr(sentence_transformers, self._CLASSES[self.kind])
        return cls(probe.path or settings.model, device=device, **dict(settings.options))


class SpacyLoader:
    """spaCy pipelines, by installed package name or folder."""

    def __repr__(self) -> str:
        return "SpacyLoader()"

    def probe(self, settings: EncoderSettings, environ: Mapping[str, str]) -> Probe:
        missing = find_library("spacy", "spacy", "spaCy")
        if missing:
            return Probe(False, missing)
        model = settings.model
        if model.startswith("pkg:") or "/" in model or model.startswith((".", "~")):
            folder, reason = resolve_model(model, base_dir=settings.base_dir, environ=environ)
            if folder is None:
                return Probe(False, reason or f"spaCy model {model!r} is not a folder")
        else:
            if not model.isidentifier():
                return Probe(False, f"spaCy model {model!r} is neither a package name nor a folder")
            root = package_dir(model)
            if root is None:
                return Probe(False, f"spaCy model package {model!r} is not installed")
            folder = _spacy_pipeline_dir(root)
        if not os.path.isfile(os.path.join(folder, "config.cfg")):
            return Probe(False, f"spaCy model folder {folder!r} has no config.cfg")
        return Probe(True, path=folder, **model_metadata(folder, "spacy", settings.options))

    def build(self, settings: EncoderSettings, *, device: str, probe: Probe) -> Any:
        import spacy

        if device.startswith("cuda"):
            _, _, index = device.partition(":")
            spacy.require_gpu(int(index or 0))  # type: ignore[attr-defined]
        return spacy.load(probe.path or settings.model, **dict(settings.options))


def _spacy_pipeline_dir(root: str) -> str:
    """A spaCy model package keeps its pipeline in a versioned subfolder."""
    if os.path.isfile(os.path.join(root, "config.cfg")):
        return root
    for child in sorted(os.listdir(root)):
        if os.path.isfile(os.path.join(root, child, "config.cfg")):
            return os.path.join(root, child)
    return root


def default_loader(kind: str) -> Loader:
    """The real loader for a kind."""
    if kind == "spacy":
        return SpacyLoader()
    if kind == "remote":
        from ._remote import RemoteLoader

        return RemoteLoader()
    return SentenceTransformersLoader(kind)
