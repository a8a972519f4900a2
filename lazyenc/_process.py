"""Process facts for the status surfaces: RSS, uptime, what is imported."""

from __future__ import annotations

import os
import sys
import time

__all__ = ["human_bytes", "rss_bytes", "torch_imported", "uptime_s"]

_STARTED = time.time()


def rss_bytes() -> int | None:
    """The process's current resident set size (not the peak), or None if unknown."""
    try:
        import psutil
    except ImportError:  # psutil is a dependency; /proc keeps a broken install readable
        try:
            with open("/proc/self/statm", encoding="ascii") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return None
    return int(psutil.Process().memory_info().rss)


def process_started_at() -> float:
    """When this process started (epoch seconds)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # pragma: no cover - psutil missing or sandboxed /proc
        return _STARTED


def uptime_s() -> float:
    """Seconds since the process started."""
    return max(0.0, time.time() - process_started_at())


def torch_imported() -> bool:
    """Whether torch is already in this process (never imports it)."""
    return "torch" in sys.modules


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover
