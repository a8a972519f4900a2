"""The ``lazyenc`` command: status, warmup, encode, demo, serve.

Every error is one line on stderr and a non-zero exit: 2 for bad usage or
configuration, 1 for an encoder that cannot serve.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._exceptions import ConfigError, LazyEncError
from ._manager import EncoderManager
from ._process import human_bytes, rss_bytes
from ._proxy import ComponentStatus

__all__ = ["main"]

DEFAULT_CONFIG = "lazyenc.toml"


def _quiet_libraries() -> None:
    # Progress bars and load reports from transformers drown the CLI's own output.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _manager(args: argparse.Namespace) -> EncoderManager:
    path = args.config or os.environ.get("LAZYENC_CONFIG") or DEFAULT_CONFIG
    if not os.path.exists(path):
        raise ConfigError("file not found (pass --config FILE or set LAZYENC_CONFIG)", source=path)
    return EncoderManager.from_toml(path)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def format_table(statuses: Sequence[ComponentStatus]) -> str:
    """The components as an aligned text table."""
    headers = ["NAME", "KIND", "STATE", "DEVICE", "DIM", "LOAD_S", "CALLS", "WEIGHTS", "REASON"]
    rows = [
        [
            s.name,
            s.kind,
            s.state,
            s.device,
            _fmt(s.dimension),
            _fmt(s.load_seconds),
            str(s.calls),
            human_bytes(s.weight_bytes),
            s.reason,
        ]
        for s in statuses
    ]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()
        for row in [headers, *rows]
    ]
    return "\n".join(lines)


def _print_status(mgr: EncoderManager, *, as_json: bool) -> None:
    rss = rss_bytes()
    if as_json:
        doc = {
            "process": {"pid": os.getpid(), "rss_bytes": rss, "rss_human": human_bytes(rss)},
            "lazy_encoders": mgr.lazy_encoders,
            "components": [s.as_dict() for s in mgr.status()],
        }
        print(json.dumps(doc, indent=2))
        return
    print(format_table(mgr.status()))
    print(f"process RSS: {human_bytes(rss)}")


def cmd_status(args: argparse.Namespace) -> int:
    with _manager(args) as mgr:
        _print_status(mgr, as_json=args.json)
    return 0


def cmd_warmup(args: argparse.Namespace) -> int:
    with _manager(args) as mgr:
        for name in args.names:
            mgr[name]  # an unknown name fails before anything is built
        failed = False
        try:
            statuses = mgr.warmup(*args.names)
        except LazyEncError as exc:
            print(f"lazyenc: {exc}", file=sys.stderr)
            failed = True
            statuses = [mgr[n].status() for n in args.names]
        for s in statuses:
            took = f"built in {s.load_seconds:.2f} s" if s.load_seconds is not None else s.reason
            print(f"{s.name:<12} {s.state:<11} {took}")
        print(f"process RSS: {human_bytes(rss_bytes())}")
        return 1 if failed or any(s.state == "disabled" for s in statuses) else 0


def _encode_output(proxy: Any, texts: list[str]) -> Any:
    kind = proxy.kind
    if kind == "remote":  # answers like the server encoder's kind, learnt from its status
        reason = proxy.status().reason
        kind = proxy.remote_kind
        if kind not in ("dense", "sparse", "rerank"):
            raise LazyEncError(f"remote encoder {proxy.name!r} cannot encode here: {reason or kind}")
    if kind == "dense":
        vectors = proxy.encode(texts)
        return [
            {"text": t, "dimension": len(v), "embedding": [round(float(x), 6) for x in v]}
            for t, v in zip(texts, vectors, strict=False)
        ]
    if kind == "sparse":
        vectors = proxy.encode(texts)
        return [
            {"text": t, "top_tokens": [[tok, round(float(w), 4)] for tok, w in proxy.decode(v, top_k=10)]}
            for t, v in zip(texts, vectors, strict=False)
        ]
    if kind == "rerank":
        if len(texts) < 2:
            raise LazyEncError(f"encoder {proxy.name!r} is a reranker: give a query, then documents")
        query, docs = texts[0], texts[1:]
        return {
            "query": query,
            "ranking": [
                {**r, "score": round(float(r["score"]), 6)}
                for r in proxy.rank(query, docs, return_documents=True)
            ],
        }
    docs = proxy.pipe(texts)
    return [
        {
            "text": t,
            "tokens": [[tok.text, tok.pos_, tok.lemma_] for tok in doc],
            "entities": [[ent.text, ent.label_] for ent in doc.ents],
        }
        for t, doc in zip(texts, docs, strict=False)
    ]


def cmd_encode(args: argparse.Namespace) -> int:
    with _manager(args) as mgr:
        print(json.dumps(_encode_output(mgr[args.name], args.texts), indent=None if args.compact else 2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    with _manager(args) as mgr:
        dense: Any = next((p for p in mgr.proxies() if p.kind == "dense" and p.state != "unavailable"), None)
        print("== status at start: nothing is loaded ==")
        _print_status(mgr, as_json=False)
        if dense is None:
            raise LazyEncError("the demo needs an available encoder of kind 'dense' in the config")
        before = rss_bytes() or 0
        text = "Lazy loading pays only for the encoders a process uses."
        print(f"\n== one call: {dense.name}.encode([{text!r}]) ==")
        vector = dense.encode([text])[0]
        print(f"{len(vector)} dims, first values {[round(float(x), 4) for x in vector[:4]]}")
        print(f"\n== status after: {dense.name} is loaded, the others are untouched ==")
        _print_status(mgr, as_json=False)
        print(f"RSS grew by {human_bytes((rss_bytes() or 0) - before)} for that one encoder")
    return 0


def cmd_admin(args: argparse.Namespace) -> int:
    from .admin import serve

    try:
        serve(_manager(args), host=args.host, port=args.port)
    except ImportError as exc:  # the admin extra is missing; the message names it
        print(f"lazyenc: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import serve

    path = args.config or os.environ.get("LAZYENC_CONFIG") or DEFAULT_CONFIG
    if not os.path.exists(path):
        raise ConfigError("file not found (pass --config FILE or set LAZYENC_CONFIG)", source=path)
    return serve(path, host=args.host, port=args.port, insecure=args.insecure)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="lazyenc", description="Lazily loaded ML encoders.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", help=f"TOML file (default: $LAZYENC_CONFIG or {DEFAULT_CONFIG})")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("status", parents=[common], help="show every encoder without loading any")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("warmup", parents=[common], help="build encoders now and print build times")
    p.add_argument("names", nargs="*", help="encoders to build (default: every available one)")
    p.set_defaults(func=cmd_warmup)

    p = sub.add_parser("encode", parents=[common], help="run one encoder on texts and print JSON")
    p.add_argument("name")
    p.add_argument("texts", nargs="+", help="texts (for a reranker: the query, then documents)")
    p.add_argument("--compact", action="store_true", help="one line of JSON")
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("demo", parents=[common], help="status, one dense call, status again")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("admin", parents=[common], help="serve the admin panel and /metrics with uvicorn")
    p.add_argument("--host", help="address to bind (default: [admin] host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: [admin] port, 8710)")
    p.set_defaults(func=cmd_admin)

    p = sub.add_parser("serve", parents=[common], help="serve the encoders over HTTP (OpenAI-compatible)")
    p.add_argument("--host", help="interface to bind (default: [server] host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: [server] port, 8700)")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback host without API keys")
    p.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    _quiet_libraries()
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"lazyenc: config error: {exc}", file=sys.stderr)
        return 2
    except LazyEncError as exc:
        print(f"lazyenc: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
