"""Cheap probes: is the backing library installed, are the model's files on disk?

Nothing here imports torch, sentence-transformers or spaCy, and nothing touches
CUDA: a probe must be safe before a fork and cost a few milliseconds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Probe", "find_library", "hf_cache_dir", "model_metadata", "resolve_model"]

# Weight files that the loaders actually read; ONNX and OpenVINO exports are skipped.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SKIP_DIRS = {"onnx", "openvino", ".git", "__pycache__"}
_TRUTHY = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class Probe:
    """What a probe found, all read from disk without loading anything."""

    available: bool
    reason: str = ""
    path: str | None = None
    dimension: int | None = None
    max_seq_length: int | None = None
    revision: str | None = None
    weight_bytes: int | None = None


def find_library(module: str, extra: str, package: str) -> str:
    """'' when the top-level ``module`` is importable, else a reason naming the extra."""
    # A dotted name would import its parent package: probe top-level names only.
    top = module.partition(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return ""
    return f"{package} is not installed: pip install 'lazyenc[{extra}]'"


def package_dir(package: str) -> Path | None:
    """The folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return Path(locations[0])
    return Path(spec.origin).parent if spec.origin else None


def hf_cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def downloads_allowed(environ: Mapping[str, str]) -> bool:
    """False when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set."""
    return not any(
        environ.get(var, "").strip().lower() in _TRUTHY for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _cached_snapshot(model_id: str, environ: Mapping[str, str]) -> Path | None:
    repo = hf_cache_dir(environ) / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text(encoding="utf-8").strip()
        if candidate.is_dir():
            return candidate
    found = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def is_path_like(model: str, base_dir: str) -> bool:
    """Whether ``model`` names a folder rather than a hub id."""
    if model.startswith(("/", "./", "../", "~", ".\\")):
        return True
    return (Path(base_dir) / model).is_dir()


def resolve_model(model: str, *, base_dir: str, environ: Mapping[str, str]) -> tuple[Path | None, str]:
    """(folder on disk or None, reason it is missing or '') for a model string.

    ``pkg:<package>/<subpath>``, a local path, or a hub id looked up in the local
    Hugging Face cache. A hub id that is not cached resolves to (None, '') when
    downloads are allowed: the build will fetch it.
    """
    if model.startswith("pkg:"):
        package, _, sub = model[4:].partition("/")
        root = package_dir(package)
        if root is None:
            return None, f"package {package!r} is not installed (model {model!r})"
        folder = root / sub if sub else root
        if not folder.is_dir():
            return None, f"no folder {str(folder)!r} in package {package!r} (model {model!r})"
        return folder, ""
    if is_path_like(model, base_dir):
        folder = (Path(base_dir) / Path(model).expanduser()).resolve()
        if not folder.is_dir():
            return None, f"model folder {str(folder)!r} does not exist"
        return folder, ""
    snapshot = _cached_snapshot(model, environ)
    if snapshot is not None:
        return snapshot, ""
    if downloads_allowed(environ):
        return None, ""
    return None, (
        f"model {model!r} is not in the local Hugging Face cache "
        f"({hf_cache_dir(environ)}) and HF_HUB_OFFLINE is set"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _weight_files(folder: Path) -> list[Path]:
    """Weight files in the folder and its module subfolders (two levels)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        depth = len(Path(root).relative_to(folder).parts)
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and depth < 1]
        found += [Path(root) / f for f in files if f.endswith(_WEIGHT_SUFFIXES)]
    # transformers reads safetensors when present and ignores the .bin/.pt twins.
    if any(p.suffix == ".safetensors" for p in found):
        found = [p for p in found if p.suffix == ".safetensors"]
    return sorted(found)


def _all_files(folder: Path) -> list[Path]:
    return sorted(Path(root) / f for root, _, files in os.walk(folder) for f in files)


def fingerprint(files: list[Path], folder: Path) -> str:
    """A short, stable id from the files' names, sizes and modification times."""
    digest = hashlib.sha1()
    for f in files:
        st = f.stat()
        digest.update(f"{f.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def _revision(folder: Path, files: list[Path]) -> str:
    if folder.parent.name == "snapshots":
        return folder.name
    return fingerprint(files, folder)


def model_metadata(folder: Path, kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Dimension, max_seq_length, revision and weight_bytes from config files on disk."""
    if kind == "spacy":
        files = _all_files(folder)
        return {
            "dimension": None,
            "max_seq_length": None,
            "revision": _revision(folder, files),
            "weight_bytes": sum(f.stat().st_size for f in files),
        }
    config = _read_json(folder / "config.json")
    st_config = _read_json(folder / "sentence_bert_config.json")
    weights = _weight_files(folder)
    dimension: int | None = None
    if kind == "dense":
        for module in _read_json_list(folder / "modules.json"):
            mconf = _read_json(folder / str(module.get("path", "")) / "config.json")
            if "out_features" in mconf:
                dimension = int(mconf["out_features"])
            elif "word_embedding_dimension" in mconf:
                dimension = int(mconf["word_embedding_dimension"])
        if dimension is None and isinstance(config.get("hidden_size"), int):
            dimension = config["hidden_size"]
        truncate = options.get("truncate_dim")
        if dimension is not None and isinstance(truncate, int) and 0 < truncate < dimension:
            dimension = truncate
    elif kind == "sparse" and isinstance(config.get("vocab_size"), int):
        dimension = config["vocab_size"]
    max_seq = st_config.get("max_seq_length") or config.get("max_position_embeddings")
    if isinstance(options.get("max_length"), int):  # CrossEncoder's own knob
        max_seq = options["max_length"]
    return {
        "dimension": dimension,
        "max_seq_length": max_seq if isinstance(max_seq, int) else None,
        "revision": _revision(folder, weights),
        "weight_bytes": sum(f.stat().st_size for f in weights) if weights else None,
    }


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
