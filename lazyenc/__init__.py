"""lazyenc: several ML encoders in one process, each built on first use.

Only the standard library is imported here; sentence-transformers, spaCy and
torch are imported when a model is built.
"""

from ._config import (
    AdminSettings,
    BatchSettings,
    EncoderSettings,
    ExpectSettings,
    HardwareSettings,
    ServerSettings,
    Settings,
    load_config,
    parse_config,
)
from ._exceptions import (
    ConfigError,
    EncoderClosedError,
    EncoderLoadError,
    EncoderUnavailableError,
    InvalidInputError,
    LazyEncError,
    MemoryBudgetError,
    OverloadedError,
    RemoteError,
    UnknownEncoderError,
)
from ._loaders import Loader
from ._manager import EncoderManager
from ._probe import Probe
from ._proxy import (
    ComponentStatus,
    DenseProxy,
    Encoder,
    EncoderProxy,
    RerankProxy,
    SpacyProxy,
    SparseProxy,
)

__version__ = "0.1.0"

__all__ = [
    "AdminSettings",
    "BatchSettings",
    "ComponentStatus",
    "ConfigError",
    "DenseProxy",
    "Encoder",
    "EncoderClosedError",
    "EncoderLoadError",
    "EncoderManager",
    "EncoderProxy",
    "EncoderSettings",
    "EncoderUnavailableError",
    "ExpectSettings",
    "HardwareSettings",
    "InvalidInputError",
    "LazyEncError",
    "Loader",
    "MemoryBudgetError",
    "OverloadedError",
    "Probe",
    "RemoteError",
    "RemoteProxy",
    "RerankProxy",
    "ServerSettings",
    "Settings",
    "SpacyProxy",
    "SparseProxy",
    "UnknownEncoderError",
    "__version__",
    "load_config",
    "parse_config",
]


def __getattr__(name: str) -> object:
    # The remote proxy pulls in its own dataclasses and transport code; most
    # processes never use it, so it is imported on first access.
    if name == "RemoteProxy":
        from ._remote import RemoteProxy

        return RemoteProxy
    raise AttributeError(f"module 'lazyenc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"RemoteProxy"})
