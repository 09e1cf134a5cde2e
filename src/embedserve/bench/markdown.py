"""report.md: machine, targets, one table per length bucket with ratios to the first target."""

from __future__ import annotations

from typing import Any

from embedserve.bench.interference import DOCS, FLOOD, IDLE
from embedserve.bench.stats import ALL
from embedserve.lengths import BUCKET_NAMES

NA = "n/a"


def _num(v: Any, digits: int = 1) -> str:
    if v is None or v == "" or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _mb(v: Any) -> str:
    return _num(v / 2**20, 0) if isinstance(v, (int, float)) else "-"


def _ratio(a: Any, b: Any) -> str:
    ok = all(isinstance(x, (int, float)) and x == x for x in (a, b))
    return f"{a / b:.2f}x" if ok and b else "-"


def _reference(rows: list[dict[str, Any]], first: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """The first target's row for the same cell: same token budget, else its best budget."""
    same = [
        r
        for r in rows
        if r["target"] == first
        and r["scenario"] == row["scenario"]
        and r["length"] == row["length"]
        and r["length_bucket"] == row["length_bucket"]
        and r["concurrency"] == row["concurrency"]
    ]
    exact = [r for r in same if r["token_budget"] == row["token_budget"]]
    pool = exact or [r for r in same if isinstance(r["tok_per_s"], (int, float))]
    return max(pool, key=lambda r: r["tok_per_s"] or 0.0) if pool else None


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(line) + " |" for line in body),
    ]


def _matrix(rows: list[dict[str, Any]], first: str) -> list[str]:
    header = [
        "target",
        "length",
        "conc",
        "budget",
        "req/s",
        "tok/s",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "queue p50 ms",
        "peak MB",
        "added MB",
        "tok/CPU-s",
        "err",
        "oom",
        "cos min",
        f"tok/s vs {first}",
        "tok/CPU-s vs first",
        "mem vs first",
        "added vs first",
    ]
    lines: list[str] = []
    for bucket in (*BUCKET_NAMES, ALL):
        mine = [r for r in rows if r["scenario"] == "matrix" and r["length_bucket"] == bucket]
        if not mine:
            continue
        body = []
        for r in mine:
            ref = _reference(rows, first, r)
            body.append(
                [
                    r["target"],
                    r["length"],
                    str(r["concurrency"]),
                    str(r["token_budget"]),
                    _num(r["req_per_s"], 2),
                    _num(r["tok_per_s"], 0),
                    _num(r["p50_ms"]),
                    _num(r["p95_ms"]),
                    _num(r["p99_ms"]),
                    _num(r["queue_p50_ms"]),
                    _mb(r["peak_mem_bytes"]),
                    _mb(r.get("added_mem_bytes")),
                    _num(r.get("tok_per_cpu_s"), 0),
                    str(r["errors"]),
                    str(r["oom"]),
                    _num(r["cosine_min"], 5),
                    _ratio(r["tok_per_s"], ref["tok_per_s"]) if ref else "-",
                    _ratio(r.get("tok_per_cpu_s"), ref.get("tok_per_cpu_s")) if ref else "-",
                    _ratio(r["peak_mem_bytes"], ref["peak_mem_bytes"]) if ref else "-",
                    _ratio(r.get("added_mem_bytes"), ref.get("added_mem_bytes")) if ref else "-",
                ]
            )
        lines += ["", f"### Bucket {bucket}", "", *_table(header, body)]
    return lines


def _interference(rows: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, Any], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["scenario"] in (IDLE, FLOOD, DOCS):
            groups.setdefault((r["target"], r["token_budget"]), {})[r["scenario"]] = r
    if not groups:
        return []
    header = [
        "target",
        "budget",
        "flood clients",
        "idle p50 ms",
        "idle p95 ms",
        "flood p50 ms",
        "flood p95 ms",
        "p95 flood/idle",
        "docs tok/s",
        "errors",
    ]
    body = []
    for (target, budget), by in groups.items():
        idle, flood, docs = by.get(IDLE, {}), by.get(FLOOD, {}), by.get(DOCS, {})
        errors = sum(int(x.get("errors") or 0) + int(x.get("oom") or 0) for x in by.values())
        body.append(
            [
                target,
                str(budget),
                str(idle.get("concurrency", "-")),
                _num(idle.get("p50_ms")),
                _num(idle.get("p95_ms")),
                _num(flood.get("p50_ms")),
                _num(flood.get("p95_ms")),
                _ratio(flood.get("p95_ms"), idle.get("p95_ms")),
                _num(docs.get("tok_per_s"), 0),
                str(errors),
            ]
        )
    return ["", "## Interference: short queries while long documents flood", "", *_table(header, body)]


def render(meta: dict[str, Any], rows: list[dict[str, Any]], plots: list[str]) -> str:
    m = meta["machine"]
    first = rows[0]["target"] if rows else ""
    lines = [
        f"# embedserve bench ({meta['scenario']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Machine: {m['cpu_model']}, {m['cores']} logical cores ({m['physical_cores']} physical), "
        f"{_num(m['memory_bytes'] / 2**30)} GiB RAM, torch {m['torch_version']} "
        f"(default {m['torch_threads']} threads), GPU: {m['gpu'] or 'none'}; {m['date']}; load average "
        f"{m['load_avg_1m']} at the start, {m.get('load_avg_1m_end', '-')} at the end.",
        "",
        "Latencies are end to end per request; tok/s counts input tokens of successful requests over "
        "the cell's wall time; tok/CPU-s divides them by the CPU seconds the target used (its process, "
        "or a served target's process tree), which holds up when other work shares the cores. "
        "Ratios compare a row with the first target's row of the same cell (same token budget, "
        "else the first target's best budget for that cell).",
        "",
        *_table(
            ["target", "spec", "budget", "device", "threads", "load s", "peak memory measured as", "error"],
            [
                [
                    g["target"],
                    f"`{g['spec']}`",
                    str(g["token_budget"] or NA),
                    g["device"] or "-",
                    str(g["threads"] or "-"),
                    _num(g["load_s"]),
                    g["mem_method"],
                    g["error"] or "",
                ]
                for g in meta["groups"]
            ],
        ),
    ]
    lines += _matrix(rows, first) + _interference(rows)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"
