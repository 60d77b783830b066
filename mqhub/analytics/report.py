"""The analytics report: matplotlib PNG plots and one self-contained ``report.html``.

Input is plain Python (the collected report tables as lists of dicts and the summary), so this
module needs matplotlib but neither Spark nor Twisted. Images are embedded as base64 data URIs.
"""

from __future__ import annotations

import base64
import html
import io
import os
from typing import Any

TOP_ADDRESSES = 6
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.kpi { display: inline-block; margin: 0 1.5em 1em 0; } .kpi b { display: block; font-size: 1.4em; }
img { max-width: 100%; border: 1px solid #eee; }
"""


def _figure() -> tuple[Any, Any]:
    """A new figure and axes on the non-interactive backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=100)
    return fig, ax


def _save(fig: Any, path: str) -> bytes:
    """Write ``fig`` as PNG to ``path`` and return the bytes."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return data


def _empty(ax: Any, text: str) -> None:
    """Mark an axes as having no data."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#888")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_throughput(rows: list[dict[str, Any]], path: str) -> bytes:
    """Published messages per minute for the busiest addresses."""
    fig, ax = _figure()
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["address"]] = totals.get(r["address"], 0) + (r["published"] or 0)
    top = sorted(totals, key=lambda a: -totals[a])[:TOP_ADDRESSES]
    if not top:
        _empty(ax, "no traffic")
    for address in top:
        per: dict[Any, int] = {}
        for r in rows:
            if r["address"] == address:
                per[r["minute"]] = per.get(r["minute"], 0) + (r["published"] or 0)
        xs = sorted(per)
        ax.plot(xs, [per[x] for x in xs], marker="o", ms=3, label=address)
    if top:
        import datetime as dt

        import matplotlib.dates as mdates

        minutes = sorted({r["minute"] for r in rows if r["address"] in top})
        pad = dt.timedelta(minutes=1)
        ax.set_xlim(minutes[0] - pad, minutes[-1] + pad)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.autofmt_xdate()
    ax.set_title("Published messages per minute (top addresses)")
    ax.set_ylabel("messages / minute")
    return _save(fig, path)


def plot_latency(rows: list[dict[str, Any]], path: str) -> bytes:
    """p50 / p90 / p99 latency bars per address and kind (log scale)."""
    fig, ax = _figure()
    rows = sorted(rows, key=lambda r: -(r["count"] or 0))[:2 * TOP_ADDRESSES]
    if not rows:
        _empty(ax, "no deliveries")
    else:
        labels = [f"{r['address']} {r['kind']}" for r in rows]
        xs = range(len(rows))
        for i, (key, color) in enumerate((("p50_ms", "#4c72b0"), ("p90_ms", "#dd8452"),
                                          ("p99_ms", "#c44e52"))):
            ax.bar([x + (i - 1) * 0.27 for x in xs], [max(r[key] or 0, 0.001) for r in rows],
                   width=0.27, label=key[:-3], color=color)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    ax.set_title("Latency from publish (ms): deliver = first delivery, ack = acknowledgement")
    ax.set_ylabel("ms (log)")
    return _save(fig, path)


def _bars(rows: list[dict[str, Any]], label: str, value: str, title: str, ylabel: str,
          path: str, color: str) -> bytes:
    """A simple bar chart of ``value`` by ``label``."""
    fig, ax = _figure()
    if not rows:
        _empty(ax, "none")
    else:
        names = [str(r[label]) or "(none)" for r in rows]
        ax.bar(names, [r[value] or 0 for r in rows], color=color)
        for x, r in enumerate(rows):
            ax.annotate(str(r[value] or 0), (x, r[value] or 0), ha="center", va="bottom",
                        fontsize=8)
        ax.tick_params(axis="x", labelsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    return _save(fig, path)


def plot_dead_letters(rows: list[dict[str, Any]], path: str) -> bytes:
    """Dead letters by reason (all queues together)."""
    by: dict[str, int] = {}
    for r in rows:
        by[r["reason"] or "(none)"] = by.get(r["reason"] or "(none)", 0) + r["count"]
    merged = [{"reason": k, "count": v} for k, v in sorted(by.items())]
    return _bars(merged, "reason", "count", "Dead letters by reason", "messages", path, "#c44e52")


def _table_html(name: str, rows: list[dict[str, Any]], limit: int = 50) -> str:
    """An HTML table of the first ``limit`` rows."""
    if not rows:
        return f"<p><i>{html.escape(name)}: no rows</i></p>"
    cols = list(rows[0])
    out = ["<table><tr>", *[f"<th>{html.escape(c)}</th>" for c in cols], "</tr>"]
    for r in rows[:limit]:
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float):
                v = f"{v:.3f}"
            cells.append(f"<td>{html.escape(str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    if len(rows) > limit:
        out.append(f"<p><i>{len(rows) - limit} more rows in {html.escape(name)}/ (Parquet)</i></p>")
    return "".join(out)


def write_report(out: str, tables: dict[str, list[dict[str, Any]]],
                 summary: dict[str, Any]) -> str:
    """Draw the plots into ``out/plots/`` and write ``out/report.html``; return its path."""
    plots = os.path.join(out, "plots")
    os.makedirs(plots, exist_ok=True)
    images = [
        ("Throughput", plot_throughput(tables["throughput"], os.path.join(plots, "throughput.png"))),
        ("Latency", plot_latency(tables["latency"], os.path.join(plots, "latency.png"))),
        ("Protocol mix", _bars(tables["protocols"], "origin", "messages",
                               "Messages published per protocol", "messages",
                               os.path.join(plots, "protocols.png"), "#55a868")),
        ("Payload sizes", _bars(tables["sizes"], "bucket", "count",
                                "Payload size histogram (upper bound, bytes)", "messages",
                                os.path.join(plots, "sizes.png"), "#8172b3")),
        ("Dead letters", plot_dead_letters(tables["dead_letters"],
                                           os.path.join(plots, "dead_letters.png"))),
    ]
    kpis = [("messages published", summary.get("messages")),
            ("deliveries", summary.get("delivered")), ("acks", summary.get("acked")),
            ("requeues", summary.get("requeued")), ("dead letters", summary.get("dead_lettered")),
            ("expired", summary.get("expired")), ("purged", summary.get("purged")),
            ("memory-tier published", summary.get("memory_published")),
            ("from", summary.get("first")), ("to", summary.get("last"))]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>mqhub analytics</title>",
             f"<style>{_STYLE}</style></head><body><h1>mqhub flow report</h1>",
             f"<p>Source: <code>{html.escape(str(summary.get('source')))}</code> · "
             f"Spark master <code>{html.escape(str(summary.get('master')))}</code></p>"]
    parts += [f"<div class='kpi'>{html.escape(k)}<b>{html.escape(str(v))}</b></div>"
              for k, v in kpis]
    for title, data in images:
        b64 = base64.b64encode(data).decode()
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' "
                     f"src='data:image/png;base64,{b64}'>")
    for name, rows in tables.items():
        parts.append(f"<h2>Table <code>{html.escape(name)}</code></h2>")
        parts.append(_table_html(name, rows))
    parts.append("</body></html>")
    path = os.path.join(out, "report.html")
    with open(path, "w") as f:
        f.write("".join(parts))
    return path
