"""The admin page: server-rendered HTML from the same document as ``/admin/components``.

No JavaScript, no framework, no asset from elsewhere (the machines have no
network): a table, inline CSS, and a ``<meta http-equiv="refresh">``. Every piece
of text goes through ``html.escape``; reasons carry exception messages and
model paths, which may hold anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ._process import human_bytes

__all__ = ["render_page"]

# Fields with a column of their own (or folded into another one); any other field
# a ComponentStatus grows is shown generically after these.
_SHOWN = {
    "name",
    "kind",
    "state",
    "model",
    "device",
    "dimension",
    "weight_bytes",
    "load_seconds",
    "loading_for_s",
    "rss_delta_bytes",
    "calls",
    "errors",
    "loaded_at",
    "last_used_at",
    "in_flight",
    "idle_unload_at",
    "retry_at",
    "batches_run",
    "mean_batch_size",
    "queue_depth",
    "reason",
}
# Redundant with a shown column, or too detailed for the table; still in the JSON.
_HIDDEN = {"loaded", "max_seq_length", "revision"}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem;color:#1f2328;
background:#fff}
h1{font-size:1.4rem;margin:0 0 .75rem}
dl.process{display:flex;flex-wrap:wrap;gap:.4rem 1.6rem;margin:0 0 1rem;padding:.6rem .9rem;
background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px}
dl.process div{display:flex;gap:.4rem}
dt{color:#57606a}
dd{margin:0;font-weight:600}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border:1px solid #d0d7de;padding:.35rem .55rem;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600;white-space:nowrap}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.time{white-space:nowrap}
td.model{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:.8rem;min-width:12rem;
word-break:break-all}
td.reason{color:#57606a;min-width:12rem;max-width:28rem;word-break:break-word}
.badge{display:inline-block;padding:.1rem .55rem;border-radius:1rem;font-weight:600;font-size:.8rem;
white-space:nowrap;border:1px solid transparent}
.state-loaded .badge{background:#dafbe1;color:#116329;border-color:#4ac26b}
.state-loading .badge{background:#fff8c5;color:#7d4e00;border-color:#d4a72c}
.state-idle .badge{background:#eaeef2;color:#424a53;border-color:#afb8c1}
.state-disabled .badge{background:#ffebe9;color:#a40e26;border-color:#ff8182}
.state-unavailable .badge{background:#f6f8fa;color:#6e7781;border-color:#d0d7de;border-style:dashed}
tr.state-disabled td{background:#fff5f5}
.ok{color:#116329}
.bad{color:#a40e26}
footer{margin-top:1rem;color:#57606a;font-size:.8rem}
footer code{background:#f6f8fa;padding:0 .25rem;border-radius:4px}
"""


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    return f"{_duration(max(0.0, now - ts))} ago"


def _until(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    return f"in {_duration(ts - now)}" if ts > now else "due"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f} min"
    hours = minutes / 60
    if hours < 48:
        return f"{int(hours)} h {int(minutes % 60)} min"
    return f"{hours / 24:.1f} d"


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _generic(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def _cell(text: Any, *, cls: str = "", title: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    if title:
        attrs += f' title="{escape(title)}"'
    return f"<td{attrs}>{escape(str(text))}</td>"


def _state_cell(c: Mapping[str, Any]) -> str:
    label = str(c.get("state", "?"))
    if c.get("loading_for_s") is not None:
        label += f" {float(c['loading_for_s']):.1f} s"
    return f'<td class="state"><span class="badge">{escape(label)}</span></td>'


def _row(c: Mapping[str, Any], extras: Sequence[str], now: float) -> str:
    state = escape(str(c.get("state", "")))
    name = escape(str(c.get("name", "")))
    load_s = c.get("load_seconds")
    delta = c.get("rss_delta_bytes")
    loaded_at, last_used = c.get("loaded_at"), c.get("last_used_at")
    idle_at, retry_at = c.get("idle_unload_at"), c.get("retry_at")
    cells = [
        f'<th scope="row" class="name">{name}</th>',
        _cell(c.get("kind", "")),
        _state_cell(c),
        _cell(c.get("model", ""), cls="model"),
        _cell(c.get("device", "")),
        _cell(_generic(c.get("dimension")), cls="num"),
        _cell(human_bytes(c.get("weight_bytes")), cls="num"),
        _cell("-" if load_s is None else f"{float(load_s):.2f} s", cls="num"),
        _cell(human_bytes(delta) if delta is not None else "-", cls="num"),
        _cell(c.get("calls", 0), cls="num"),
        _cell(c.get("errors", 0), cls="num"),
        _cell(_ago(loaded_at, now), cls="time", title=_utc(loaded_at) if loaded_at else ""),
        _cell(_ago(last_used, now), cls="time", title=_utc(last_used) if last_used else ""),
        _cell(c.get("in_flight", 0), cls="num"),
        _cell(_until(idle_at, now), cls="time", title=_utc(idle_at) if idle_at else ""),
        _cell(_until(retry_at, now), cls="time", title=_utc(retry_at) if retry_at else ""),
        _cell(_generic(c.get("batches_run")), cls="num"),
        _cell(_generic(c.get("mean_batch_size")), cls="num"),
        _cell(_generic(c.get("queue_depth")), cls="num"),
        _cell(c.get("reason") or "", cls="reason"),
        *(_cell(_generic(c.get(key)), cls=f"extra extra-{escape(key)}") for key in extras),
    ]
    return (
        f'<tr id="component-{name}" class="component state-{state}" data-name="{name}" '
        f'data-state="{state}">{"".join(cells)}</tr>'
    )


def _extra_fields(components: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for c in components:
        for key in c:
            if key not in _SHOWN and key not in _HIDDEN:
                seen.setdefault(key, None)
    return list(seen)


def _process(doc: Mapping[str, Any], ready: tuple[bool, list[str]]) -> str:
    p = doc.get("process") or {}
    cuda = p.get("cuda")
    if cuda is None:
        cuda_text = "not checked (torch not imported)"
    elif not cuda:
        cuda_text = "not in use"
    else:
        cuda_text = ", ".join(
            f"cuda:{d.get('device')} {human_bytes(d.get('allocated_bytes'))} allocated" for d in cuda
        )
    ok, reasons = ready
    items = [
        ("PID", str(p.get("pid", "-")), ""),
        ("RSS", str(p.get("rss_human", "-")), ""),
        ("uptime", _duration(float(p.get("uptime_s") or 0.0)), ""),
        ("torch imported", "yes" if p.get("torch_imported") else "no", ""),
        ("CUDA", cuda_text, ""),
        ("lazy encoders", "yes" if doc.get("lazy_encoders") else "no (eager)", ""),
        ("ready", "yes" if ok else "no: " + "; ".join(reasons), "ok" if ok else "bad"),
    ]
    rows = []
    for key, value, cls in items:
        attrs = f' class="{cls}"' if cls else ""
        rows.append(f"<div><dt>{escape(key)}</dt><dd{attrs}>{escape(value)}</dd></div>")
    return f'<dl class="process">{"".join(rows)}</dl>'


def render_page(
    doc: Mapping[str, Any],
    *,
    ready: tuple[bool, list[str]],
    refresh_s: float,
    json_url: str,
    metrics_url: str,
    now: float | None = None,
) -> str:
    """The whole page for one components document (as served by ``/admin/components``)."""
    now = time.time() if now is None else now
    components: list[Mapping[str, Any]] = list(doc.get("components") or [])
    extras = _extra_fields(components)
    headers = [
        "name",
        "kind",
        "state",
        "model",
        "device",
        "dim",
        "weights",
        "build time",
        "RSS Δ",
        "calls",
        "errors",
        "built",
        "last used",
        "in flight",
        "idle unload",
        "retry",
        "batches",
        "mean batch",
        "queued",
        "reason",
        *extras,
    ]
    head = "".join(f'<th scope="col">{escape(h)}</th>' for h in headers)
    body = "".join(_row(c, extras, now) for c in components) or (
        f'<tr><td colspan="{len(headers)}">no encoders configured</td></tr>'
    )
    refresh = f'<meta http-equiv="refresh" content="{refresh_s:g}">' if refresh_s > 0 else ""
    refresh_note = f"Refreshes every {refresh_s:g} s. " if refresh_s > 0 else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{refresh}<title>lazyenc admin</title><style>{_CSS}</style></head><body>"
        "<h1>lazyenc encoders</h1>"
        f"{_process(doc, ready)}"
        f'<table id="components"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        f"<footer>{escape(refresh_note)}Rendered {escape(_utc(now))}. Reading this page never loads a "
        f'model. <a href="{escape(json_url)}">JSON</a> · <a href="{escape(metrics_url)}">metrics</a> · '
        "load, unload and reset: <code>POST …/components/NAME/load</code> with "
        "<code>Authorization: Bearer TOKEN</code>.</footer>"
        "</body></html>"
    )
