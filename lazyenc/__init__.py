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
