"""The lazyenc command: status, warmup, encode, demo, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lazyenc._cli import main

ROOT = Path(__file__).resolve().parent.parent


def test_status_json_lists_every_encoder_idle_with_rss(
    example_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lazyenc status --json` shows the four encoders idle and the process RSS."""
    assert 0 == main(["status", "--config", str(example_config), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert ["idle"] * 4 == [c["state"] for c in doc["components"]]
    assert doc["process"]["rss_bytes"] > 0
    assert doc["lazy_encoders"] is True


def test_status_table_has_a_row_per_encoder(example_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The text table has a header, four rows and the RSS line."""
    assert 0 == main(["status", "--config", str(example_config)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "KIND", "STATE"]
    assert ["dense", "rerank", "sparse", "spacy"] == [line.split()[0] for line in lines[1:5]]
    assert lines[5].startswith("process RSS: ")


@pytest.mark.parametrize(
    ("argv", "code", "fragment"),
    [
        (["status", "--config", "/nonexistent/lazyenc.toml"], 2, "file not found"),
        (["encode", "nope", "x"], 1, "no encoder named 'nope'; configured: dense, rerank, sparse, spacy"),
        (["warmup", "nope"], 1, "no encoder named 'nope'"),
        (["encode", "rerank", "only-a-query"], 1, "give a query, then documents"),
    ],
)
def test_errors_are_one_line_with_nonzero_exit(
    example_config: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, fragment: str
) -> None:
    """Bad input prints a single line on stderr and exits non-zero."""
    if "--config" not in argv:
        argv = [*argv, "--config", str(example_config)]
    assert code == main(argv)
    err = capsys.readouterr().err
    assert 1 == len(err.strip().splitlines())
    assert fragment in err


def test_config_error_names_file_and_key(write_toml, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """A config mistake exits 2 with the file and key in one line."""
    path = write_toml("[hardware]\ndevise = 'cpu'\n")
    assert 2 == main(["status", "--config", str(path)])
    err = capsys.readouterr().err.strip()
    assert (
        f"lazyenc: config error: {path}: [hardware.devise]: unknown key 'devise' (did you mean 'device'?)"
        in err
    )


@pytest.mark.real
def test_encode_prints_vectors_and_tags(example_config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lazyenc encode` prints a 384-dim vector for dense and tokens for spaCy."""
    assert 0 == main(["encode", "dense", "hello world", "--config", str(example_config), "--compact"])
    (row,) = json.loads(capsys.readouterr().out)
    assert ("hello world", 384, 384) == (row["text"], row["dimension"], len(row["embedding"]))
    assert 0 == main(["encode", "spacy", "London calling", "--config", str(example_config)])
    (doc,) = json.loads(capsys.readouterr().out)
    assert "London" == doc["tokens"][0][0]


@pytest.mark.real
def test_warmup_builds_and_prints_build_times(
    example_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`lazyenc warmup sparse` builds it and prints its build time."""
    assert 0 == main(["warmup", "sparse", "--config", str(example_config)])
    out = capsys.readouterr().out
    assert out.startswith("sparse")
    assert "loaded" in out and "built in" in out


@pytest.mark.real
def test_demo_runs_in_a_fresh_process(example_config: Path) -> None:
    """The README's demo: nothing loaded, one dense call, dense loaded and the rest idle."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", "lazyenc", "demo", "--config", str(example_config)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    before, after = out.split("== status after")
    assert 4 == sum(" idle " in line for line in before.splitlines())
    rows = {
        line.split()[0]: line.split()[2]
        for line in after.splitlines()[1:]
        if line.split()[:1] in (["dense"], ["rerank"], ["sparse"], ["spacy"])
    }
    assert {"dense": "loaded", "rerank": "idle", "sparse": "idle", "spacy": "idle"} == rows
    assert "RSS grew by" in out
