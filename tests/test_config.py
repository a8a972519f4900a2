"""TOML parsing: every error names the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

import lazyenc
from lazyenc import ConfigError, load_config


def test_example_config_parses_into_frozen_settings(example_config: Path) -> None:
    """config.example.toml gives four encoders with their kinds, lazily."""
    settings = load_config(example_config)
    assert ["dense", "rerank", "sparse", "spacy"] == [e.name for e in settings.encoders]
    assert ["dense", "rerank", "sparse", "spacy"] == [e.kind for e in settings.encoders]
    assert settings.hardware.lazy_encoders is True
    assert "auto" == settings.hardware.device
    assert 1 == settings.encoder("rerank").options["num_labels"]
    with pytest.raises(AttributeError):
        settings.hardware.device = "cpu"  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.encoder("rerank").options["num_labels"] = 2  # type: ignore[index]


def test_defaults_apply_when_tables_are_absent(write_toml) -> None:  # type: ignore[no-untyped-def]
    """An empty file is valid: lazy, device auto, no encoders."""
    settings = load_config(write_toml(""))
    assert lazyenc.HardwareSettings() == settings.hardware
    assert () == settings.encoders


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("[hardware]\nlazy_encoder = true\n", "hardware.lazy_encoder", "did you mean 'lazy_encoders'"),
        ("[hardware]\nlazy_encoders = 'yes'\n", "hardware.lazy_encoders", "must be true or false"),
        ("[hardware]\ndevice = 'gpu'\n", "hardware.device", "valid: auto, cpu, cuda, cuda:N, mps"),
        ("[hardware]\nmax_loaded = 0\n", "hardware.max_loaded", "must be > 0"),
        ("[hardware]\nmalloc_arena_max = 0\n", "hardware.malloc_arena_max", "must be > 0"),
        ("[hardware]\nmalloc_arena_max = 1.5\n", "hardware.malloc_arena_max", "must be an integer"),
        ("[hardware]\nidle_unload_s = true\n", "hardware.idle_unload_s", "must be a number"),
        ("[encoders.a]\nkind = 'dense'\n", "encoders.a.model", "is required"),
        ("[encoders.a]\nmodel = 'x'\n", "encoders.a.kind", "is required"),
        ("[encoders.a]\nkind = 'dence'\nmodel = 'x'\n", "encoders.a.kind", "did you mean 'dense'"),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nmodle = 1\n",
            "encoders.a.modle",
            "did you mean 'model'",
        ),
        ("[encoders.a]\nkind = 'dense'\nmodel = 3\n", "encoders.a.model", "must be a string"),
        ("[encoders.a]\nkind = 'dense'\nmodel = ''\n", "encoders.a.model", "must not be empty"),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\ndevice = 'cuda:x'\n",
            "encoders.a.device",
            "unknown device",
        ),
        # A trailing newline slipped through the old `$`-anchored regular expressions.
        ('[hardware]\ndevice = "cpu\\n"\n', "hardware.device", "unknown device"),
        ('[encoders."a\\n"]\nkind = "dense"\nmodel = "x"\n', "encoders.a\n", "an encoder name takes"),
        ("[encoders.a]\nkind = 'dense'\nmodel = 'pkg:a.b/m'\n", "encoders.a.model", "top-level package"),
        ("[encoders.a]\nkind = 'dense'\nmodel = 'x'\noptions = 1\n", "encoders.a.options", "must be a table"),
        ("[encoders.a]\nkind = 'dense'\nmodel = 'x'\nurl = 'http://h'\n", "encoders.a.url", "only applies"),
        ("[encoders.a]\nkind = 'remote'\nmodel = 'x'\n", "encoders.a.url", "is required"),
        ("[encoders.a]\nkind = 'remote'\nmodel = 'x'\nurl = 'h:1'\n", "encoders.a.url", "http://"),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = { max_size = 0 }\n",
            "encoders.a.batch.max_size",
            "> 0",
        ),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = { parallel = 0 }\n",
            "encoders.a.batch.parallel",
            "> 0",
        ),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = { parallel = 'two' }\n",
            "encoders.a.batch.parallel",
            "an integer or \"auto\", got 'two'",
        ),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = { parallel = true }\n",
            "encoders.a.batch.parallel",
            'an integer or "auto"',
        ),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = { size = 2 }\n",
            "encoders.a.batch.size",
            "unknown key",
        ),
        (
            "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nexpect = { dimension = 'x' }\n",
            "encoders.a.expect.dimension",
            "integer",
        ),
        ("[encoders]\na = 1\n", "encoders.a", "must be a table"),
        ("[encoders.'a b']\nkind = 'dense'\nmodel = 'x'\n", "encoders.a b", "encoder name"),
        ("[admin]\nport = 70000\n", "admin.port", "between 0 and 65535"),
        ("[server]\nmax_inputs = -1\n", "server.max_inputs", "> 0"),
        ("[hardwar]\n", "hardwar", "did you mean 'hardware'"),
    ],
)
def test_each_config_error_names_file_and_key(write_toml, text: str, key: str, fragment: str) -> None:  # type: ignore[no-untyped-def]
    """A wrong key, type or value raises ConfigError naming the file, the key and the fix."""
    path = write_toml(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key == info.value.key
    assert str(path) == info.value.source
    assert str(path) in str(info.value)
    assert f"[{key}]" in str(info.value)
    assert fragment in str(info.value)


def test_malformed_toml_names_the_file(write_toml) -> None:  # type: ignore[no-untyped-def]
    """Broken TOML syntax is a ConfigError with the file and the parser's position."""
    path = write_toml("[hardware\n")
    with pytest.raises(ConfigError, match="malformed TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "line 1" in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A config path that does not exist says so."""
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("false", False), ("1", True), ("ON", True)])
def test_environment_overrides_lazy_encoders(write_toml, value: str, expected: bool) -> None:  # type: ignore[no-untyped-def]
    """LAZYENC_LAZY_ENCODERS in the environment beats the TOML knob."""
    path = write_toml(f"[hardware]\nlazy_encoders = {str(not expected).lower()}\n")
    assert expected is load_config(path, environ={"LAZYENC_LAZY_ENCODERS": value}).hardware.lazy_encoders


def test_bad_environment_override_names_the_variable(write_toml) -> None:  # type: ignore[no-untyped-def]
    """An unparseable LAZYENC_LAZY_ENCODERS is a ConfigError naming the variable."""
    with pytest.raises(ConfigError, match="LAZYENC_LAZY_ENCODERS='maybe'"):
        load_config(write_toml(""), environ={"LAZYENC_LAZY_ENCODERS": "maybe"})


def test_batch_false_and_tables_parse(write_toml) -> None:  # type: ignore[no-untyped-def]
    """batch = false disables batching; a batch table sets its fields."""
    path = write_toml(
        "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = false\n"
        "[encoders.b]\nkind = 'dense'\nmodel = 'x'\nbatch = { max_size = 8, max_wait_ms = 1 }\n"
    )
    a, b = load_config(path).encoders
    assert lazyenc.BatchSettings(enabled=False) == a.batch
    assert lazyenc.BatchSettings(max_size=8, max_wait_ms=1.0) == b.batch


def test_batch_parallel_takes_a_count_or_auto(write_toml) -> None:  # type: ignore[no-untyped-def]
    """batch.parallel = N fixes the lanes; "auto" (the default) leaves the choice to the build."""
    path = write_toml(
        "[encoders.a]\nkind = 'dense'\nmodel = 'x'\nbatch = { parallel = 3 }\n"
        "[encoders.b]\nkind = 'dense'\nmodel = 'x'\nbatch = { parallel = 'auto' }\n"
        "[encoders.c]\nkind = 'dense'\nmodel = 'x'\n"
    )
    a, b, c = load_config(path).encoders
    assert (3, None, None) == (a.batch.parallel, b.batch.parallel, c.batch.parallel)


def test_relative_model_paths_resolve_against_the_config_folder(write_toml, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A model path like ./models/x is looked up next to the TOML file, not the cwd."""
    path = write_toml("[encoders.a]\nkind = 'dense'\nmodel = './models/x'\n")
    assert str(tmp_path.resolve()) == load_config(path).encoder("a").base_dir
