"""What `lowp inspect` prints: the text table, the JSON, and the one-page plot of an
`inspection.Inspection` (the numbers themselves come from `lowp_apps.inspection`)."""

import math
import os

import numpy as np


def table(header, rows, right=frozenset()) -> str:
    """Columns padded to their widest cell; column indices in `right` right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=False))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _db(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if v == math.inf else f"{v:.2f}"


def _pct(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    if fraction == 0:
        return "0"
    return f"{100 * fraction:.3g}"


def _log2_text(v: float) -> str:
    return str(int(v)) if v == int(v) else f"{v:.2f}"


def _scale_range(row) -> str:
    if row.scale_log2_min is None:
        return "-"
    lo, hi = _log2_text(row.scale_log2_min), _log2_text(row.scale_log2_max)
    return lo if lo == hi else f"{lo} .. {hi}"


def inspection_text(result, top: int | None = None) -> str:
    float_tensors = {r.tensor: r.elements for r in result.rows}
    elements = sum(float_tensors.values())
    out = [
        f"file: {result.path}",
        (
            f"{result.tensors} tensors: {len(float_tensors)} inspected ({elements:,} elements), "
            f"{len(result.stored)} stored quantized, {len(result.skipped)} left out"
        ),
    ]
    out += _skipped_lines(result.skipped)
    if result.stored:
        out += [
            "",
            f"stored quantized ({len(result.stored)} tensors, reported as the file holds them):",
        ]
        out.append(_stored_table(result.stored))
    out += ["", "schemes (a preset name stands for its weight scheme):"]
    out += [f"  {s.name:<18} {s.scheme}" for s in result.summaries]
    out.append("")
    summary_rows = [
        (
            s.name,
            str(s.tensors),
            str(s.not_applicable),
            _db(s.median_sqnr_db),
            s.worst_tensor or "-",
            _db(s.worst_sqnr_db),
            _pct(s.saturated_fraction),
            _pct(s.flushed_fraction),
            str(s.poisoned_groups),
        )
        for s in result.summaries
    ]
    header = (
        "scheme",
        "tensors",
        "n/a",
        "median SQNR dB",
        "worst tensor",
        "its SQNR dB",
        "sat %",
        "flush %",
        "poisoned",
    )
    out.append(table(header, summary_rows, right={1, 2, 3, 5, 6, 7, 8}))

    rows = result.rows if top is None else result.rows[:top]
    table_rows = []
    for r in rows:
        shape = "x".join(map(str, r.shape)) or "()"
        if r.not_applicable is not None:
            table_rows.append(
                (r.tensor, shape, r.scheme, f"n/a: {r.not_applicable}", "", "", "", "")
            )
            continue
        table_rows.append(
            (
                r.tensor,
                shape,
                r.scheme,
                _db(r.sqnr_db),
                _pct(r.saturated_fraction),
                _pct(r.flushed_fraction),
                _scale_range(r),
                str(r.poisoned_groups),
            )
        )
    out += ["", f"per tensor, worst SQNR first ({len(result.rows)} rows):"]
    header = ("tensor", "shape", "scheme", "SQNR dB", "sat %", "flush %", "scale log2", "poisoned")
    out.append(_na_table(header, table_rows, right={3, 4, 5, 7}))
    hidden = len(result.rows) - len(rows)
    if hidden:
        out.append(f"... {hidden} more rows hidden by --top {top}")
    return "\n".join(out)


def _skipped_lines(skipped, shown: int = 3) -> list[str]:
    """The tensors left out, one line per reason with the first few names."""
    by_reason: dict[str, list[str]] = {}
    for s in skipped:
        by_reason.setdefault(s.reason, []).append(s.tensor)
    lines = []
    for reason, names in by_reason.items():
        more = f", ... ({len(names)} tensors)" if len(names) > shown else ""
        lines.append(f"left out: {', '.join(names[:shown])}{more}: {reason}")
    if any("linear layer's weight" in s.reason for s in skipped):
        lines.append("  (--all inspects every float tensor; --filter REGEX picks tensors by name)")
    return lines


def _stored_table(stored) -> str:
    rows = [
        (
            s.tensor,
            "x".join(map(str, s.shape)) or "()",
            s.hp_dtype,
            repr(s.scheme),
            str(s.groups),
            str(s.poisoned_groups),
            _pct(s.at_max / max(s.elements, 1)),
            _pct(s.zeros / max(s.elements, 1)),
            _scale_range(s),
        )
        for s in stored
    ]
    header = (
        "tensor",
        "shape",
        "from",
        "scheme",
        "groups",
        "poisoned",
        "at max %",
        "zero %",
        "scale log2",
    )
    return table(header, rows, right={4, 5, 6, 7})


def _na_table(header, rows, right) -> str:
    """`table`, except that an "n/a: ..." cell runs on past its column instead of widening it."""
    fitted = [r for r in rows if not r[3].startswith("n/a: ")]
    widths = [max(len(str(r[i])) for r in [header, *fitted]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        if r[3].startswith("n/a: "):
            lines.append(
                "  ".join(c.ljust(w) for c, w in zip(r[:3], widths[:3], strict=False)) + "  " + r[3]
            )
            continue
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=False))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _json_number(v):
    if v is None or math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def inspection_json(result) -> dict:
    """Everything `inspection_text` prints, every row included (--top only trims text)."""
    return {
        "file": result.path,
        "tensors": result.tensors,
        "schemes": [
            {
                "name": s.name,
                "scheme": repr(s.scheme),
                "tensors": s.tensors,
                "not_applicable": s.not_applicable,
                "elements": s.elements,
                "median_sqnr_db": _json_number(s.median_sqnr_db),
                "worst_tensor": s.worst_tensor,
                "worst_sqnr_db": _json_number(s.worst_sqnr_db),
                "saturated_fraction": s.saturated_fraction,
                "flushed_fraction": s.flushed_fraction,
                "poisoned_groups": s.poisoned_groups,
            }
            for s in result.summaries
        ],
        "skipped": [
            {"tensor": s.tensor, "dtype": s.dtype, "reason": s.reason} for s in result.skipped
        ],
        "stored": [
            {
                "tensor": s.tensor,
                "shape": list(s.shape),
                "hp_dtype": s.hp_dtype,
                "scheme": repr(s.scheme),
                "elements": s.elements,
                "groups": s.groups,
                "poisoned_groups": s.poisoned_groups,
                "at_max": s.at_max,
                "zeros": s.zeros,
                "scale_log2_min": _json_number(s.scale_log2_min),
                "scale_log2_max": _json_number(s.scale_log2_max),
            }
            for s in result.stored
        ],
        "rows": [
            {
                "tensor": r.tensor,
                "shape": list(r.shape),
                "hp_dtype": r.hp_dtype,
                "scheme": r.scheme,
                "elements": r.elements,
                "sqnr_db": _json_number(r.sqnr_db),
                "saturated": r.saturated,
                "saturated_fraction": r.saturated_fraction,
                "flushed": r.flushed,
                "flushed_fraction": r.flushed_fraction,
                "groups": r.groups,
                "poisoned_groups": r.poisoned_groups,
                "scale_log2_min": _json_number(r.scale_log2_min),
                "scale_log2_max": _json_number(r.scale_log2_max),
                "not_applicable": r.not_applicable,
            }
            for r in result.rows
        ],
    }


def plot_inspection(result, png_path: str) -> None:
    """A one-page figure: SQNR per tensor per scheme, and saturated/flushed fractions."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lowp[plot]
    from matplotlib.figure import Figure

    names = [s.name for s in result.summaries]
    measured = {
        n: [r for r in result.rows if r.scheme == n and r.not_applicable is None] for n in names
    }
    finite = [r.sqnr_db for rows in measured.values() for r in rows if math.isfinite(r.sqnr_db)]
    top = max(finite, default=0.0) + 6  # where exact (inf) tensors are drawn
    bottom = min(finite, default=0.0) - 3

    fig = Figure(figsize=(12, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, height_ratios=(1.15, 1))
    fig.suptitle(
        f"lowp inspect: {os.path.basename(result.path)}\n"
        f"{len({r.tensor for r in result.rows})} float tensors, {len(result.skipped)} skipped",
        fontsize=13,
    )

    strip = fig.add_subplot(grid[0, :])
    rng = np.random.default_rng(0)  # fixed jitter: the same file draws the same picture
    for i, n in enumerate(names):
        for rank_is_1, colour, label in (
            (False, "tab:blue", "matrix (rank >= 2)"),
            (True, "tab:orange", "vector (rank 1)"),
        ):
            pts = [r.sqnr_db for r in measured[n] if (len(r.shape) <= 1) == rank_is_1]
            if not pts:
                continue
            y = np.array([top if v == math.inf else v for v in pts])
            x = i + rng.uniform(-0.3, 0.3, len(y))
            strip.scatter(
                x, y, s=12, alpha=0.6, color=colour, label=label if i == 0 else None, linewidths=0
            )
        values = [r.sqnr_db for r in measured[n] if math.isfinite(r.sqnr_db)]
        if values:
            strip.boxplot(
                [values],
                positions=[i],
                widths=0.7,
                showfliers=False,
                manage_ticks=False,
                medianprops={"color": "black"},
                boxprops={"color": "0.3"},
                whiskerprops={"color": "0.3"},
            )
        na = sum(1 for r in result.rows if r.scheme == n and r.not_applicable is not None)
        if na:
            strip.annotate(
                f"{na} n/a", (i, bottom), ha="center", va="bottom", fontsize=8, color="0.4"
            )
    if any(r.sqnr_db == math.inf for rows in measured.values() for r in rows):
        strip.axhline(top, color="0.7", lw=0.8, ls=":")
        strip.annotate(
            "exact (inf)", (len(names) - 0.5, top), ha="right", va="bottom", fontsize=8, color="0.4"
        )
    strip.set_xticks(range(len(names)), names)
    strip.set_xlim(-0.6, len(names) - 0.4)
    strip.set_ylim(bottom - 1, top + 3)
    strip.set_ylabel("SQNR (dB)")
    strip.set_title("SQNR per tensor (one dot per tensor; box: quartiles)", fontsize=11)
    strip.grid(axis="y", alpha=0.3)
    handles, labels = strip.get_legend_handles_labels()
    if handles:
        strip.legend(handles, labels, loc="lower left", fontsize=8)

    lines = fig.add_subplot(grid[1, 0])
    for n in names:
        values = np.sort(
            [
                top if r.sqnr_db == math.inf else r.sqnr_db
                for r in measured[n]
                if not math.isnan(r.sqnr_db)
            ]
        )
        if values.size:
            lines.plot(np.arange(1, values.size + 1) / values.size, values, label=n, lw=1.5)
    lines.set_xlabel("fraction of tensors (sorted, worst first)")
    lines.set_ylabel("SQNR (dB)")
    lines.set_title("SQNR distribution per scheme", fontsize=11)
    lines.grid(alpha=0.3)
    lines.legend(fontsize=8)

    bars = fig.add_subplot(grid[1, 1])
    x = np.arange(len(names))
    floor = 1e-5  # percent; bars at zero are labelled "0" instead of drawn
    for offset, key, colour, label in (
        (-0.2, "saturated_fraction", "tab:red", "saturated"),
        (0.2, "flushed_fraction", "tab:purple", "flushed to zero"),
    ):
        pct = np.array([100 * (getattr(s, key) or 0.0) for s in result.summaries])
        bars.bar(
            x + offset,
            np.where(pct > 0, pct, np.nan),
            width=0.4,
            color=colour,
            label=label,
        )
        for xi, p in zip(x + offset, pct, strict=False):
            text = "0" if p == 0 else f"{p:.2g}"
            bars.annotate(text, (xi, max(p, floor)), ha="center", va="bottom", fontsize=7)
    bars.set_yscale("log")
    bars.set_ylim(floor, 300)
    bars.set_xticks(x, names, rotation=20, ha="right")
    bars.set_ylabel("% of elements")
    bars.set_title("saturated and flushed elements, all tensors", fontsize=11)
    bars.legend(fontsize=8, loc="upper left")
    bars.grid(axis="y", alpha=0.3)
    fig.savefig(png_path, dpi=110)
