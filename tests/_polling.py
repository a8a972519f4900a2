"""Polling for tests that wait on a background thread (a hang guard, never a timing check)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], bool], *, timeout: float = 60.0) -> bool:
    """Poll ``predicate`` until it holds or a generous deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
