"""Cheap probes: is the backing library installed, are the model's files on disk?

Nothing here imports torch, sentence-transformers or spaCy, and nothing touches
CUDA: a probe must be safe before a fork and cost a few milliseconds. Plain
os.path rather than pathlib keeps `import lazyenc` light.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from typing import Any

from ._value import Value

__all__ = ["Probe", "find_library", "hf_cache_dir", "model_metadata", "resolve_model"]

# Weight files that the loaders actually read; ONNX and OpenVINO exports are skipped.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_SKIP_DIRS = {"onnx", "openvino", ".git", "__pycache__"}
_TRUTHY = {"1", "true", "yes", "on"}


class Probe(Value):
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


def package_dir(package: str) -> str | None:
    """The folder of an installed top-level package, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if locations:
        return str(locations[0])
    return os.path.dirname(spec.origin) if spec.origin else None


def hf_cache_dir(environ: Mapping[str, str]) -> str:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(environ["HF_HUB_CACHE"])
    if environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(environ["HF_HOME"]), "hub")
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "huggingface", "hub")


def downloads_allowed(environ: Mapping[str, str]) -> bool:
    """False when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set."""
    return not any(
        environ.get(var, "").strip().lower() in _TRUTHY for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _cached_snapshot(model_id: str, environ: Mapping[str, str]) -> str | None:
    repo = os.path.join(hf_cache_dir(environ), "models--" + model_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    if not os.path.isdir(snapshots):
        return None
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            candidate = os.path.join(snapshots, f.read().strip())
        if os.path.isdir(candidate):
            return candidate
    except OSError:
        pass
    found = [os.path.join(snapshots, d) for d in os.listdir(snapshots)]
    found = sorted((p for p in found if os.path.isdir(p)), key=os.path.getmtime)
    return found[-1] if found else None


def is_path_like(model: str, base_dir: str) -> bool:
    """Whether ``model`` names a folder rather than a hub id."""
    if model.startswith(("/", "./", "../", "~", ".\\")):
        return True
    return os.path.isdir(os.path.join(base_dir, model))


def resolve_model(model: str, *, base_dir: str, environ: Mapping[str, str]) -> tuple[str | None, str]:
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
        folder = os.path.join(root, sub) if sub else root
        if not os.path.isdir(folder):
            return None, f"no folder {folder!r} in package {package!r} (model {model!r})"
        return folder, ""
    if is_path_like(model, base_dir):
        folder = os.path.realpath(os.path.join(base_dir, os.path.expanduser(model)))
        if not os.path.isdir(folder):
            return None, f"model folder {folder!r} does not exist"
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


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_dict(path: str) -> dict[str, Any]:
    data = _read_json(path)
    return data if isinstance(data, dict) else {}


def _walk(folder: str, *, max_depth: int) -> list[str]:
    found: list[str] = []
    for root, dirs, files in os.walk(folder):
        depth = 0 if root == folder else os.path.relpath(root, folder).count(os.sep) + 1
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and depth < max_depth]
        found += [os.path.join(root, f) for f in files]
    return sorted(found)


def _weight_files(folder: str) -> list[str]:
    """Weight files in the folder and its module subfolders (one level down)."""
    found = [f for f in _walk(folder, max_depth=1) if f.endswith(_WEIGHT_SUFFIXES)]
    # transformers reads safetensors when present and ignores the .bin/.pt twins.
    safetensors = [f for f in found if f.endswith(".safetensors")]
    return safetensors or found


def fingerprint(files: list[str], folder: str) -> str:
    """A short, stable id from the files' names, sizes and modification times.

    FNV-1a in plain Python: hashlib would load OpenSSL at init for a dozen bytes.
    """
    h = 0xCBF29CE484222325
    for f in files:
        st = os.stat(f)
        for byte in f"{os.path.relpath(f, folder)}:{st.st_size}:{st.st_mtime_ns}\n".encode():
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"[:12]


def _revision(folder: str, files: list[str]) -> str:
    if os.path.basename(os.path.dirname(os.path.normpath(folder))) == "snapshots":
        return os.path.basename(os.path.normpath(folder))
    return fingerprint(files, folder)


def model_metadata(folder: str, kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Dimension, max_seq_length, revision and weight_bytes from config files on disk."""
    if kind == "spacy":
        files = _walk(folder, max_depth=8)
        return {
            "dimension": None,
            "max_seq_length": None,
            "revision": _revision(folder, files),
            "weight_bytes": sum(os.path.getsize(f) for f in files),
        }
    config = _read_dict(os.path.join(folder, "config.json"))
    st_config = _read_dict(os.path.join(folder, "sentence_bert_config.json"))
    weights = _weight_files(folder)
    dimension: int | None = None
    if kind == "dense":
        modules = _read_json(os.path.join(folder, "modules.json"))
        for module in modules if isinstance(modules, list) else []:
            if not isinstance(module, dict):
                continue
            mconf = _read_dict(os.path.join(folder, str(module.get("path", "")), "config.json"))
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
        "weight_bytes": sum(os.path.getsize(f) for f in weights) if weights else None,
    }
