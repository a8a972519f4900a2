"""Parallel lanes: one coalesced batch cut in parts that run at once on CPU cores.

torch runs a forward pass on all of its intra-op threads, and on a batch of
short texts they spend much of it waiting on each other: here a 16-text MiniLM
batch is 1.76x faster on 2 threads than on 1, not 2x. Two halves of the batch,
each on one thread of its own, finish sooner (docs/batching.md#parallel-lanes).

A lane needs a model object of its own (one model must not run two calls at
once: its tokenizer is not re-entrant), so lanes after the first run on a
*replica*: a deep copy of the model's Python objects and tokenizer that shares
every parameter and buffer with it (about 8 MiB, not another copy of the
weights). Each lane thread limits its own torch threads; the other threads of
the process keep theirs.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["auto_parallel", "limit_this_thread", "replicate", "torch_threads"]

_SWITCH_LOCK = threading.Lock()


def _torch() -> Any:
    # Never imported here: a model that is a torch module has imported it already.
    return sys.modules.get("torch")


def _is_torch_module(model: Any) -> bool:
    torch = _torch()
    return torch is not None and isinstance(model, torch.nn.Module)


def torch_threads() -> int:
    """The calling thread's torch intra-op threads; 1 when torch is not imported."""
    torch = _torch()
    return 1 if torch is None else int(torch.get_num_threads())


def auto_parallel(model: Any, device: str | None) -> int:
    """``parallel = "auto"`` for dense and rerank: 2 lanes for a torch model on a 2+ thread CPU.

    Not on a GPU, where one pass is already parallel, nor for models that are
    not torch modules (lanes then have nothing to divide).
    """
    if not (device or "cpu").startswith("cpu") or not _is_torch_module(model):
        return 1
    return 2 if torch_threads() >= 2 else 1


def replicate(model: Any) -> Any:
    """A copy of ``model`` that shares its tensors: its own modules and tokenizer, the same weights."""
    import copy  # not on `import lazyenc`'s path

    memo: dict[int, Any] = {}
    if _is_torch_module(model):
        for tensor in (*model.parameters(), *model.buffers()):
            memo[id(tensor)] = tensor
    return copy.deepcopy(model, memo)


def _in_fresh_thread(fn: Callable[[], Any]) -> Any:
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()), name="lazyenc-torch-threads")
    thread.start()
    thread.join()
    return box[0]


def limit_this_thread(threads: int) -> None:
    """Run the calling thread's torch ops on ``threads`` intra-op threads; others keep theirs.

    ``torch.set_num_threads`` sets the calling thread's OpenMP and MKL counts,
    and also the count that threads first using torch later start with. That
    second part is put back from a short-lived thread, so the host's threads
    are not affected.
    """
    torch = _torch()
    if torch is None:
        return
    with _SWITCH_LOCK:
        default = _in_fresh_thread(torch.get_num_threads)
        # torch sets up each thread's count on its first use from the process-wide one; done
        # now, or it would undo this thread's count once the process-wide one is put back.
        torch.get_num_threads()
        torch.set_num_threads(threads)
        _in_fresh_thread(lambda: torch.set_num_threads(default))
