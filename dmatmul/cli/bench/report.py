"""Reporting: the terminal tables, the JSON file and the plot.

One table per problem (every implementation with its ratio to each peer, the
predicted time and modelled bytes per rank against the lower bound), the
summary of ``dmatmul auto`` against its peers with the benchmark issue's
targets, the run's metadata, the JSON rows and the PNG plot (matplotlib,
optional).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ... import _cost
from .peers import PEERS
from .problem import grid_shape
from .timing import Progress, Result

# targets of the benchmark issue (8 simulated CPU devices, n = 2048 and 4096, float32)
TARGETS = {"xla": (1.0, 1.1), "numpy": (0.75, 0.85)}


def peers_of(results: Sequence[Result]) -> dict[str, Result]:
    return {r.impl: r for r in results if r.impl in PEERS}


def _ms(s: float | None) -> str:
    return "-" if s is None or not math.isfinite(s) else f"{s * 1e3:.1f}"


def format_group(results: Sequence[Result]) -> str:
    """The table of one problem: every implementation with its ratios to each peer."""
    if not results:
        return ""
    r0 = results[0]
    peers = peers_of(results)
    where = f"{r0.ranks} devices" if r0.mode == "devices" else f"{r0.ranks} processes"
    head = f"n={r0.n} {r0.dtype}, {where}, layout (a, b, result) = {_layout_name(r0.layout)}"
    if "G" in r0.layout.upper():
        head += f", grid {grid_shape(r0.ranks)[0]}x{grid_shape(r0.ranks)[1]}"
    cols = f"{'implementation':34s} {'median ms':>9s} {'min':>8s} {'max':>8s} {'GFLOP/s':>8s}"
    for name in peers:
        cols += f" {'x ' + name:>9s}"
    cols += f" {'pred ms':>8s} {'MiB/rank':>9s} {'/bound':>6s} {'peak MiB':>8s} {'/ideal':>6s}"
    lines = [head, cols, "-" * len(cols)]
    for r in results:
        if not r.times:
            continue
        line = f"{r.label():34s} {_ms(r.median):>9s} {_ms(min(r.times)):>8s} {_ms(max(r.times)):>8s} {r.gflops:8.1f}"
        for p in peers.values():
            line += f" {p.median / r.median:8.2f}x"
        mb = "-" if r.modelled_bytes is None else f"{r.modelled_bytes / 2**20:.1f}"
        bound = (
            f"{r.modelled_bytes / r.lower_bound_bytes:.2f}"
            if r.modelled_bytes is not None and r.lower_bound_bytes
            else "-"
        )
        line += f" {_ms(r.predicted_s):>8s} {mb:>9s} {bound:>6s}"
        peak = "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.1f}"
        ratio = "-" if r.memory_ratio is None else f"{r.memory_ratio:.2f}"
        line += f" {peak:>8s} {ratio:>6s}"
        if r.note:
            line += f"  [{r.note}]"
        lines.append(line)
    return "\n".join(lines) + "\n"


def show_group(group: list[Result], out: list[Result], progress: Progress, flush: Callable[[], None]) -> None:
    """A finished group: keep its results, print its table (the progress bar
    cleared first) and ``flush`` (rewrite the JSON file)."""
    out.extend(group)
    progress.clear()
    print(format_group(group), flush=True)
    flush()


def _layout_name(layout: str) -> str:
    names = {"X": "Slab.X", "Y": "Slab.Y", "R": "Replicated()", "G": "BlockNonCyclic(grid)"}
    return "(" + ", ".join(names[c] for c in layout.upper()) + ")"


def format_summary(results: Sequence[Result]) -> str:
    """dmatmul auto against each peer, per problem, with the issue's targets
    (8 devices, n = 2048 and 4096, float32)."""
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    lines = []
    head = (
        f"{'n':>5s} {'ranks':>5s} {'layout':8s} {'auto ran':15s} {'x xla':>7s} {'paired':>7s} "
        f"{'x numpy':>8s} {'paired':>7s} {'pred/meas':>9s}  target"
    )
    lines += [
        "dmatmul auto against its peers (ratio of medians, and median of the per-repetition ratios; "
        "> 1: dmatmul faster)",
        head,
        "-" * len(head),
    ]
    for key, rs in groups.items():
        auto = next((r for r in rs if r.impl == "dmatmul:auto" and r.times), None)
        if auto is None:
            continue
        peers = peers_of(rs)
        vs = {name: p.median / auto.median for name, p in peers.items()}
        paired = {name: auto.paired_ratio(p) for name, p in peers.items()}
        target = ""
        if auto.mode == "devices" and auto.ranks == 8 and auto.n in (2048, 4096) and auto.dtype == "float32":
            checks = []
            for name, (need, aim) in TARGETS.items():
                if name in vs:
                    mark = "aim met" if vs[name] >= aim else ("met" if vs[name] >= need else "MISSED")
                    checks.append(f"{name} >= {need}: {mark}")
            target = "; ".join(checks)
        pm = f"{auto.predicted_s / auto.median:.2f}" if auto.predicted_s else "-"
        fx, px = (f"{vs['xla']:.2f}x", f"{paired['xla']:.2f}x") if "xla" in vs else ("-", "-")
        fn, pn = (f"{vs['numpy']:.2f}x", f"{paired['numpy']:.2f}x") if "numpy" in vs else ("-", "-")
        lines.append(
            f"{auto.n:5d} {auto.ranks:5d} {auto.layout:8s} {auto.algorithm or '-':15s} {fx:>7s} {px:>7s} "
            f"{fn:>8s} {pn:>7s} {pm:>9s}  {target}"
        )
    return "\n".join(lines) + "\n"


def run_meta(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    import jax

    from ... import __version__

    models = {}
    platform_name = jax.devices()[0].platform
    counts = sorted({r for r in (args.devices if mode == "devices" else [jax.process_count()])})
    for p in counts:
        model = _cost.model_for(platform_name, p)
        models[str(p)] = {**model.to_dict(), "source": model.source}
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "mode": mode,
        "host": socket.gethostname(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "jax": jax.__version__,
        "dmatmul": __version__,
        "reps": args.reps,
        "warmup": args.warmup,
        "dtype": args.dtype,
        "models": models,
        "timing": "interleaved repetitions (a seeded random order per repetition); medians; "
        "ratio x P = P's median / this median; paired = median of the per-repetition ratios",
    }


def write_json(path: str, results: Sequence[Result], meta: dict[str, Any]) -> None:
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for r in results:
        groups.setdefault(r.group, []).append(r)
    rows = []
    for rs in groups.values():
        peers = peers_of(rs)
        rows += [r.to_json(peers) for r in rs if r.times]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1, default=float)
        f.write("\n")
    os.replace(tmp, path)


def write_plot(path: str, results: Sequence[Result]) -> str | None:
    """GFLOP/s (median, min-max bars) against n per implementation; one panel
    per (layout, ranks). Returns a message when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install 'dmatmul[bench]'): no plot"
    layouts = sorted({r.layout for r in results}, key=lambda x: (x != "XYX", x))
    ranks = sorted({r.ranks for r in results})
    fig, axes = plt.subplots(
        len(layouts), len(ranks), figsize=(4.2 * len(ranks), 3.4 * len(layouts)), squeeze=False, sharey=True
    )
    style: dict[str, dict[str, Any]] = {
        "dmatmul:auto": dict(color="C0", lw=2.5, marker="o"),
        "xla": dict(color="C3", lw=1.8, marker="s"),
        "xla-1dev": dict(color="C1", lw=1.2, ls=":", marker="^"),
        "numpy": dict(color="k", lw=1.2, ls="--", marker="x"),
    }
    others = sorted({r.impl for r in results if r.impl not in style})
    for k, impl in enumerate(others):
        style[impl] = dict(color=("C2", "C4", "C5", "C6", "C8", "C9")[k % 6], lw=1.2, ls="-.", marker=".")
    order = {impl: i for i, impl in enumerate(["dmatmul:auto", *others, "xla", "xla-1dev", "numpy"])}
    top = max((r.flops / min(r.times) / 1e9 for r in results if r.times), default=1.0)
    legend: dict[str, Any] = {}
    for i, layout in enumerate(layouts):
        for j, p in enumerate(ranks):
            ax = axes[i][j]
            impls: dict[str, list[Result]] = {}
            for r in results:
                if r.layout == layout and r.ranks == p and r.times:
                    impls.setdefault(r.impl, []).append(r)
            for impl, rs in sorted(impls.items(), key=lambda kv: order.get(kv[0], 99)):
                rs.sort(key=lambda r: r.n)
                xs = [r.n for r in rs]
                ys = [r.gflops for r in rs]
                lo = [r.gflops - r.flops / max(r.times) / 1e9 for r in rs]
                hi = [r.flops / min(r.times) / 1e9 - r.gflops for r in rs]
                label = "dmatmul auto" if impl == "dmatmul:auto" else rs[0].label()
                h = ax.errorbar(xs, ys, yerr=[lo, hi], label=label, capsize=2, **style[impl])
                legend.setdefault(impl, (h, label))
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r.n for r in results}))
            ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
            ax.get_xaxis().set_minor_locator(matplotlib.ticker.NullLocator())
            mode = results[0].mode
            ax.set_title(f"{_layout_name(layout)}, {p} {'devices' if mode == 'devices' else 'processes'}", fontsize=9)
            if i == len(layouts) - 1:
                ax.set_xlabel("n (M = N = K)")
            if j == 0:
                ax.set_ylabel(f"GFLOP/s ({results[0].dtype})")
            ax.grid(alpha=0.3)
            ax.set_ylim(0, top * 1.05)
    items = sorted(legend.items(), key=lambda kv: order.get(kv[0], 99))
    handles, labels = [h for _, (h, _) in items], [lab for _, (_, lab) in items]
    ncol = min(len(labels), 3 if len(ranks) < 3 else 4)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
    fig.suptitle(f"dmatmul bench on {socket.gethostname()} ({os.cpu_count()} cores): median, min-max bars", fontsize=10)
    rows = -(-len(labels) // ncol)
    fig.tight_layout(rect=(0, (0.25 * rows + 0.15) / (3.4 * len(layouts)), 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
