"""`dvc exp show` turned on its side: a block per experiment (its name and the params that
differ between the experiments shown), a row per variant, the figures with their spread.

    dvc exp show --json --no-pager | python tools/exp_table.py      (what `make exps` runs)

DVC's own table has a column per variant and figure, named `reports/metrics/<variant>.json:
<figure>`: with the five default variants, far wider than a terminal. This one stays within
120 columns whatever the variants.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

METRICS_DIR = "reports/metrics"  # dvc.yaml's compare metrics: one file per variant
# (heading, figure): each shown as "value (lo–hi)" where the file has <figure>_lo/_hi
COLUMNS = (
    ("steady epoch s", "steady_epoch_s"),
    ("speedup vs cpu", "speedup_vs_cpu"),
    ("vs fp32", "speedup_vs_fp32"),
    ("to target s", "time_to_target_s"),
    ("accuracy", "test_accuracy"),
)


def _revisions(shown: list[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """The workspace and each baseline, each followed by its experiments."""
    for entry in shown:
        yield entry
        for group in entry.get("experiments") or []:
            yield from group.get("revs") or []


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _cell(figures: Mapping[str, Any], key: str) -> str:
    value = figures.get(key)
    if not isinstance(value, int | float):
        return "-"
    text = f"{value:.4g}"
    lo, hi = figures.get(f"{key}_lo"), figures.get(f"{key}_hi")
    if isinstance(lo, int | float) and isinstance(hi, int | float):
        text += f" ({lo:.3g}–{hi:.3g})"
    return text


def _settings(params: Mapping[str, Any], changed: list[str], variants: set[str]) -> list[str]:
    """`key=value` for each param that differs between the revisions; a variant this
    revision lacks once, as `variants.<name>=-` (not a `=None` per key of the others')."""
    out: list[str] = []
    for key in changed:
        parts = key.split(".")
        if parts[0] == "variants" and len(parts) > 2 and parts[1] not in variants:
            absent = f"variants.{parts[1]}=-"
            if absent not in out:
                out.append(absent)
        else:
            out.append(f"{key}={params.get(key, '-')}")
    return out


def table(shown: list[Mapping[str, Any]], width: int = 120) -> str:
    revisions = [r for r in _revisions(shown) if r.get("data")]
    raw = {id(r): (r["data"].get("params") or {}).get("params.yaml", {}).get("data") or {} for r in revisions}  # fmt: skip
    params = {key: _flat(values) for key, values in raw.items()}
    keys = sorted({k for p in params.values() for k in p})
    changed = [k for k in keys if len({json.dumps(p.get(k)) for p in params.values()}) > 1]
    lines = []
    for rev in revisions:
        name = rev.get("name") or rev.get("rev") or "?"
        if rev.get("rev") not in (None, "workspace", name):
            name += f" ({rev['rev'][:7]})"
        settings = "  ".join(
            _settings(params[id(rev)], changed, set(raw[id(rev)].get("variants") or {}))
        )
        lines.append(f"{name}  {settings}".rstrip()[:width])
        metrics = rev["data"].get("metrics") or {}
        rows = [("  variant", *(heading for heading, _ in COLUMNS))]
        order = list(raw[id(rev)].get("variants") or {})  # params.yaml's, as the report's table

        def place(item: tuple[str, Any], order: list[str] = order) -> tuple[int, str]:
            stem = PurePosixPath(item[0]).stem
            return (order.index(stem) if stem in order else len(order), stem)

        for path, content in sorted(metrics.items(), key=place):
            if PurePosixPath(path).parent != PurePosixPath(METRICS_DIR):
                continue
            figures = (content or {}).get("data") or {}
            rows.append((f"  {PurePosixPath(path).stem}", *(_cell(figures, k) for _, k in COLUMNS)))
        used = [i for i in range(len(COLUMNS) + 1) if any(r[i] != "-" for r in rows[1:]) or i == 0]
        widths = {i: max(len(r[i]) for r in rows) for i in used}
        for row in rows:
            lines.append("  ".join(row[i].ljust(widths[i]) for i in used).rstrip()[:width])
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    print(table(json.load(sys.stdin)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
