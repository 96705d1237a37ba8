"""Markdown tables (the seeds' layout) and PNG plots from a results dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import common
from benchmarks.harness.common import table

DEFAULT_ROW = "vLLM default"
TARGET_HIGH_CLIENTS = 64
TARGET_HIGH_RATIO = 1.2
TARGET_LOW_RATIO = 0.97
TARGET_HEALTH_CLIENTS = 128
TARGET_HEALTH_P99_MS = 5.0


def _ok_rows(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: row for name, row in workload["rows"].items() if row.get("status") == "ok"}


def _level(row: dict[str, Any], key: str, clients: int) -> dict[str, Any] | None:
    return next((lvl for lvl in row.get(key, []) if lvl["clients"] == clients), None)


def _table(header: list[str], rows: list[list[str]]) -> str:
    return table(header, rows).rstrip("\n")


def overhead_table(workload: dict[str, Any]) -> str:
    rows = []
    for name, row in workload["rows"].items():
        online = row.get("overhead_online") or {}
        offline = row.get("overhead_offline") or {}
        rows.append([
            name,
            f"{online['mean_ms']:.2f}" if online else "-",
            f"{online['p50_ms']:.2f}" if online else "-",
            f"{offline['mean_ms']:.2f}" if offline else "-",
            f"{offline['p50_ms']:.2f}" if offline else "-",
        ])
    return _table(["row", "online mean ms", "online p50 ms", "offline mean ms", "offline p50 ms"], rows)


def sweep_table(workload: dict[str, Any], key: str = "sweep") -> str:
    """The seeds' layout: one line per n_clients, `tokens/s  mean-ms` per row."""
    rows = _ok_rows(workload)
    clients = sorted({lvl["clients"] for row in rows.values() for lvl in row.get(key, [])})
    header = ["n_clients"]
    for name in rows:
        header += [f"{name} tok/s", f"{name} ms"]
    body = []
    for c in clients:
        line = [str(c)]
        for row in rows.values():
            lvl = _level(row, key, c)
            line += [f"{lvl['tokens_per_s']:.0f}", f"{lvl['mean_ms']:.2f}"] if lvl else ["-", "-"]
        body.append(line)
    return _table(header, body)


def detail_table(workload: dict[str, Any], key: str = "sweep") -> str:
    """Per row and level: req/s, mean/p99 latency, `/health` p50/p99/max, errors."""
    body = []
    for name, row in _ok_rows(workload).items():
        for lvl in row.get(key, []):
            h = lvl["health"]
            body.append([
                name, str(lvl["clients"]), str(lvl["requests"]), f"{lvl['requests_per_s']:.1f}",
                f"{lvl['tokens_per_s']:.0f}", f"{lvl['mean_ms']:.2f}", f"{lvl['p99_ms']:.2f}",
                f"{h['p50_ms']:.2f}", f"{h['p99_ms']:.2f}", f"{h['max_ms']:.2f}", str(lvl["errors"]),
            ])
    return _table(
        ["row", "clients", "requests", "req/s", "tok/s", "mean ms", "p99 ms",
         "/health p50 ms", "/health p99 ms", "/health max ms", "errors"],
        body,
    )


def targets(workload: dict[str, Any]) -> list[dict[str, Any]]:
    """The sweep's targets (docs/benchmarks.md), as ratios; each entry says met / missed / not measurable."""
    rows = _ok_rows(workload)
    out: list[dict[str, Any]] = []
    default = rows.get(DEFAULT_ROW)
    strategies = {n: r for n, r in rows.items() if r.get("strategy")}

    def rps(row: dict[str, Any], c: int) -> float | None:
        lvl = _level(row, "sweep", c)
        return lvl["requests_per_s"] if lvl else None

    for clients, ratio in ((TARGET_HIGH_CLIENTS, TARGET_HIGH_RATIO), (1, TARGET_LOW_RATIO)):
        name = f"best strategy >= {ratio}x vLLM default at {clients} clients"
        base = rps(default, clients) if default else None
        cands = {n: rps(r, clients) for n, r in strategies.items()}
        cands = {n: v for n, v in cands.items() if v is not None}
        if not base or not cands:
            out.append({"target": name, "status": "not measured",
                        "detail": "needs the vLLM default row and at least one offload row"})
            continue
        best = max(cands, key=lambda n: cands[n] or 0.0)
        r = (cands[best] or 0.0) / base
        out.append({"target": name, "status": "met" if r >= ratio else "missed",
                    "detail": f"{best}: {cands[best]:.1f} req/s vs {base:.1f} req/s = {r:.2f}x"})
    for n, row in strategies.items():
        lvl = _level(row, "sweep", TARGET_HEALTH_CLIENTS)
        if lvl is None:
            continue
        p99 = lvl["health"]["p99_ms"]
        if row["strategy"] == "inline":
            out.append({"target": f"inline shows the blocked loop at {TARGET_HEALTH_CLIENTS} clients",
                        "status": "met" if p99 > TARGET_HEALTH_P99_MS else "missed",
                        "detail": f"/health p99 {p99:.1f} ms"})
        else:
            out.append({"target": f"{n}: /health p99 <= {TARGET_HEALTH_P99_MS} ms at {TARGET_HEALTH_CLIENTS} clients",
                        "status": "met" if p99 <= TARGET_HEALTH_P99_MS else "missed",
                        "detail": f"/health p99 {p99:.1f} ms"})
    return out


def plot(workload_name: str, workload: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _ok_rows(workload)
    if not any(row.get("sweep") for row in rows.values()):
        return []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = [
        ("requests_per_s", "requests/s", False),
        ("mean_ms", "mean latency (ms)", True),
        ("health_p99", "/health p99 during load (ms)", True),
    ]
    for ax, (key, label, logy) in zip(axes, panels, strict=True):
        for name, row in rows.items():
            levels = row.get("sweep", [])
            xs = [lvl["clients"] for lvl in levels]
            ys = [lvl["health"]["p99_ms"] if key == "health_p99" else lvl[key] for lvl in levels]
            ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        if logy and all(y > 0 for line in ax.get_lines() for y in line.get_ydata()):
            ax.set_yscale("log")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[2].axhline(TARGET_HEALTH_P99_MS, color="grey", linestyle="--", linewidth=1)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"vLLM pooling server, {workload_name}: throughput, latency, liveness")
    fig.tight_layout()
    path = out_dir / f"e2e_{workload_name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def markdown(results: dict[str, Any], plots: dict[str, list[Path]]) -> str:
    meta = results["meta"]
    parts = [
        "# offload end-to-end benchmark",
        "",
        common.start("meta"),
        f"- date: {meta['date']}",
        f"- machine: {meta['cpus']} CPUs ({meta['cpu']}), {meta['platform']}, Python {meta['python']}",
        f"- load average before / after: {meta['loadavg_before']} / {meta.get('loadavg_after', '-')}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        f"- git commit: {meta['commit']}{' (dirty tree)' if meta.get('git_dirty') else ''}",
        (
            f"- mode: {meta['mode']}; levels {meta['clients']}; {meta['level_seconds']} s per level "
            f"(at most {meta['level_max_requests']} requests); run took {meta.get('wall_s', 0):.0f} s"
        ),
    ]
    parts += [f"- note: {note}" for note in meta.get("notes", [])]
    parts += [common.end("meta")]
    # The docs page includes everything between these markers (pymdownx.snippets sections).
    parts += ["", common.start("tables")]
    for wname, workload in results["workloads"].items():
        parts += ["", f"## Workload: {wname}", "", workload.get("description", ""), ""]
        skipped = [f"- {n}: {r['status']}" for n, r in workload["rows"].items() if r.get("status") != "ok"]
        if skipped:
            parts += ["Rows not measured:", "", *skipped, ""]
        parts += ["### Overhead at 1 client (short request)", "", overhead_table(workload), ""]
        parts += ["### Concurrency sweep (tokens/s and mean latency, the seeds' layout)", "",
                  sweep_table(workload), ""]
        parts += ["### Sweep details and /health liveness", "", detail_table(workload), ""]
        if any(r.get("heavy") for r in workload["rows"].values()):
            parts += [f"### Post-processing heavy: {workload.get('heavy_inputs', 256)} inputs per request",
                      "", sweep_table(workload, "heavy"), "", detail_table(workload, "heavy"), ""]
        tg = targets(workload)
        if tg:
            parts += ["### Targets", "", _table(["target", "status", "detail"],
                                                [[t["target"], t["status"], t["detail"]] for t in tg]), ""]
    parts += [common.end("tables"), ""]
    parts += [f"![{w}]({p.name})" for w, paths in plots.items() for p in paths]
    return "\n".join(parts) + "\n"
