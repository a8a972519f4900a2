"""Shared fixtures: the example config and one real manager per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import lazyenc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.toml"

# The hubs are unreachable here; everything real comes from packaged models.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def example_config() -> Path:
    """The example TOML that points at the packaged models."""
    return EXAMPLE


@pytest.fixture(scope="session")
def real_manager() -> Iterator[lazyenc.EncoderManager]:
    """A manager over the four packaged models, shared by the real-model tests."""
    with lazyenc.EncoderManager.from_toml(EXAMPLE) as mgr:
        yield mgr


@pytest.fixture
def write_toml(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write TOML text to a file and return its path."""

    def write(text: str, name: str = "lazyenc.toml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write
