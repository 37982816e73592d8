"""DVC's plots across variants, and a page that draws them with no network.

DVC's top-level `plots:` cannot loop over params.yaml's variants, so compare writes each
figure's data in long form (a row per variant and epoch, or digit) and dvc.yaml's templates
(.dvc/plots/variants*.json) colour the lines by `variant`: one plot per figure, every variant.

`dvc plots show` loads Vega, Vega-Lite and vega-embed from a CDN, so offline every plot is
blank. `html_template()` returns a page for `--html-template` with the three inlined, from
vl-convert-python (the Vega project's bundle, BSD-3-Clause); `make plots` renders with it:

    python -m accelbench.report.dvc_plots --html-template .dvc/tmp/offline-plots.html
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from accelbench.core.outputs import StagedOutputs, staged, text_kind, write_text
from accelbench.core.results import ClassScores, EpochRecord

PLOTS_DIR = "plots"  # reports/plots/: dvc.yaml's top-level plots read these files
EPOCHS_CSV = "epochs.csv"  # variant, epoch, then EPOCH_FIELDS
PER_CLASS_CSV = "per_class.csv"  # variant, digit, then CLASS_FIELDS
EPOCH_FIELDS = ("train_time_s", "test_accuracy", "train_loss")  # EpochRecord's, as named there
CLASS_FIELDS = ("precision", "recall", "f1")

# DVC's plot templates are Vega-Lite 5 specs ("$schema": ".../vega-lite/v5.json").
VEGA_LITE_MAJOR = "5"


def write_plot_data(
    out_dir: Path,
    epochs: Mapping[str, Sequence[EpochRecord]],
    per_class: Mapping[str, Mapping[str, ClassScores]] | None = None,
    outputs: StagedOutputs | None = None,
) -> list[Path]:
    """`out_dir`'s epochs.csv and per_class.csv, a row per variant and epoch (or digit), in the
    variants' order; returns their paths. Written through `outputs` (default: its own)."""
    if outputs is None:
        with staged() as outputs:
            return write_plot_data(out_dir, epochs, per_class, outputs)
    tables = {
        out_dir / EPOCHS_CSV: (
            ["variant", "epoch", *EPOCH_FIELDS],
            [
                [name, record.epoch, *(_number(getattr(record, key)) for key in EPOCH_FIELDS)]
                for name, records in epochs.items()
                for record in records
            ],
        ),
        out_dir / PER_CLASS_CSV: (
            ["variant", "digit", *CLASS_FIELDS],
            [
                [name, digit, *map(_number, (s.precision, s.recall, s.f1_score))]
                for name, digits in (per_class or {}).items()
                for digit, s in sorted(digits.items(), key=lambda item: int(item[0]))
            ],
        ),
    }
    for path, (header, rows) in tables.items():
        # compare's plot data from before is recognised by its header
        kind = text_kind("plot data written by `accelbench compare`", ",".join(header) + "\n")
        with outputs(path, kind).open("w", newline="") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(header)
            writer.writerows(rows)
    return list(tables)


def _number(value: float | None) -> float | str:
    """A blank cell for a figure not measured (None or NaN), which Vega leaves out."""
    return "" if value is None or value != value else value


PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>DVC plots (offline)</title>
    <!-- Vega {vega}, Vega-Lite {vega_lite} and vega-embed {vega_embed} (BSD-3-Clause),
         bundled by vl-convert-python {vl_convert}: no network needed. DVC's CDN script tags
         would go in a scripts placeholder, which this page leaves out on purpose. -->
    <script>(() => {
{bundle}
})();</script>
    <style>
        table { border-spacing: 15px; }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def html_template() -> str:
    """A page for `dvc plots show --html-template` with Vega, Vega-Lite and vega-embed inlined
    (the newest Vega-Lite 5 that vl-convert-python carries, as DVC's templates are v5)."""
    from importlib.metadata import version

    try:
        import vl_convert
    except ImportError:
        raise SystemExit(
            "make plots: needs vl-convert-python, the `plots` extra (make setup installs it; "
            "elsewhere: pip install 'vl-convert-python>=1.3')"
        ) from None

    vega_lite = max(
        (v for v in vl_convert.get_vegalite_versions() if v.split(".")[0] == VEGA_LITE_MAJOR),
        key=lambda v: tuple(map(int, v.split("."))),
        default=None,
    )
    if vega_lite is None:
        raise RuntimeError(
            f"vl-convert-python {version('vl-convert-python')} carries no Vega-Lite "
            f"{VEGA_LITE_MAJOR}.x (it has {vl_convert.get_vegalite_versions()}); install the "
            "version uv.lock pins (`make setup`)"
        )
    bundle = vl_convert.javascript_bundle(vl_version=vega_lite)
    # A script element ends at the first "</script" in it, wherever that is; the function
    # around it keeps the bundle's top-level names out of the page's (DVC's `var spec`).
    bundle = bundle.replace("</script", "<\\/script")
    # DVC fills {refresh_tag} and {plot_divs} with str.replace: the rest is left as written.
    page = PAGE
    for name, value in {
        "vega": vl_convert.get_vega_version(),
        "vega_lite": vega_lite,
        "vega_embed": vl_convert.get_vega_embed_version(),
        "vl_convert": version("vl-convert-python"),
    }.items():
        page = page.replace("{" + name + "}", value)
    return page.replace("{bundle}", bundle)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m accelbench.report.dvc_plots",
        description="Write the page `dvc plots show --html-template PATH` renders offline.",
    )
    parser.add_argument("--html-template", type=Path, required=True, metavar="PATH")
    args = parser.parse_args(argv)
    write_text(args.html_template, html_template())  # renamed into place, never in place
    print(f"wrote {args.html_template} (Vega inlined: `dvc plots show` renders offline with it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
