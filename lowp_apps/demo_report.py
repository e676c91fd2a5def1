"""What `lowp demo` prints, writes as JSON and draws: its `Result` as a text report,
a JSON document and a one-page PNG (matplotlib, imported only to draw)."""

import dataclasses
import math
import sys
import textwrap

from lowp_apps import minilm

# Ticks for a terminal that can print them; plain words for one that cannot (a Windows
# console in cp1252, a pipe opened as ASCII).
_UNICODE_MARKS = {True: "✓", False: "✗"}
_ASCII_MARKS = {True: "ok", False: "FAIL"}


def marks(stream=None) -> dict[bool, str]:
    """{True: pass mark, False: fail mark} that `stream` (default stdout) can print."""
    encoding = getattr(stream or sys.stdout, "encoding", None)
    if encoding is None:  # an in-memory text stream takes any character
        return _UNICODE_MARKS
    try:
        "".join(_UNICODE_MARKS.values()).encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return _ASCII_MARKS
    return _UNICODE_MARKS


def to_json(result) -> dict:
    """The result as plain JSON values, with each preset's and the overall verdict."""
    doc = dataclasses.asdict(result)
    for entry, preset in zip(doc["presets"], result.presets, strict=True):
        entry["ok"] = preset.ok
    doc["ok"] = result.ok
    return doc


def text(result) -> str:
    """The report: the weights byte for byte, embedding fidelity, the checkpoint round
    trip, and the verdict."""
    mark = marks()
    setup = ", ".join(f"{n} {v['version']} on {v['device']}" for n, v in result.frameworks.items())
    title = (
        f"lowp demo: all-MiniLM-L6-v2 ({result.parameters / 1e6:.1f}M parameters) quantized in "
        + " and ".join(result.frameworks)
    )
    lines = [title, setup]
    lines += _weights_section(result, mark)
    lines += _fidelity_section(result, mark)
    lines += _checkpoint_section(result, mark)
    if any(v["device"] == "cpu" for v in result.frameworks.values()):
        lines += [
            "",
            "On a CPU the quantized matmuls are emulated: this shows accuracy, not speed.",
        ]
    lines += ["", _summary(result, mark)]
    return "\n".join(lines)


def _weights_section(result, mark) -> list[str]:
    torch_fw, jax_fw = result.frameworks
    rows = [
        [
            p.preset,
            str(p.tensors),
            f"{p.bytes:,}",
            _verdict(mark, p.torch_jax_mismatches, p.tensors),
            _verdict(mark, p.torch_numpy_mismatches, p.tensors),
        ]
        for p in result.presets
    ]
    header = [
        "preset",
        "tensors",
        "bytes",
        f"{torch_fw} = {jax_fw}",
        f"{torch_fw} = NumPy reference",
    ]
    intro = "1. The quantized weights, byte for byte (codes + scales of every linear weight)"
    return ["", intro, *_table(header, rows)]


def _fidelity_section(result, mark) -> list[str]:
    torch_fw, jax_fw = result.frameworks
    pairs = len(minilm.SENTENCE_PAIRS)
    intro = [
        f"2. Embedding fidelity against the unquantized model over {result.sentences} sentences:",
        (
            f"   cosine, and whether all {pairs} pairs keep every paraphrase above every "
            "unrelated pair"
        ),
    ]
    header = ["preset"]
    for name in result.frameworks:
        header += [f"{name} mean cos", "min cos", "ranking"]
    rows = [["unquantized", *_fidelity_cells(result.unquantized, mark)]]
    rows += [[p.preset, *_fidelity_cells(p.fidelity, mark)] for p in result.presets]
    lines = ["", *intro, *_table(header, rows)]
    if result.presets:
        agree = ", ".join(f"{p.preset} {p.torch_jax_min_cosine:.5f}" for p in result.presets)
        note = (
            f"{torch_fw} vs {jax_fw} embeddings of each preset, lowest cosine: {agree}. Below "
            "1 the weights are still the same bytes: the activations are quantized at run "
            "time from values that each framework's float ops round slightly differently, "
            "so a few activation codes differ."
        )
        lines += textwrap.wrap(note, 90, initial_indent="   ", subsequent_indent="   ")
    return lines


def _checkpoint_section(result, mark) -> list[str]:
    torch_fw, jax_fw = result.frameworks
    intro = (
        f"3. Checkpoint {torch_fw} -> file -> {jax_fw} "
        "(lowp_torch.save_quantized, lowp_jax.load_quantized; lowp.load in NumPy)"
    )
    header = [
        "preset",
        "file",
        f"loaded = {jax_fw}-quantized",
        f"lowp.load = {torch_fw}",
        f"{jax_fw} embeddings",
    ]
    rows = []
    for p in result.presets:
        c = p.checkpoint
        same = (
            "identical" if c.embeddings_identical else f"max |diff| {c.embeddings_max_abs_diff:.3g}"
        )
        loaded = (
            f"{mark[c.quantized_match]} {p.tensors} quantized, "
            f"{mark[c.plain_match]} {c.plain_tensors} plain"
        )
        rows.append(
            [
                p.preset,
                f"{c.file_bytes / 1e6:.1f} MB",
                loaded,
                mark[c.numpy_match],
                f"{mark[c.embeddings_identical]} {same}",
            ]
        )
    return ["", intro, *_table(header, rows)]


def _summary(result, mark) -> str:
    tensors = sum(p.tensors for p in result.presets)
    megabytes = sum(p.bytes for p in result.presets) / 1e6
    trips = f"{len(result.presets)} checkpoint round trip" + (
        "s" if len(result.presets) > 1 else ""
    )
    if result.ok:
        return (
            f"{mark[True]} Identical bytes in {', '.join(result.frameworks)} and NumPy: "
            f"{tensors} quantized tensors ({megabytes:.1f} MB) and {trips}, "
            f"in {result.seconds:.0f} s."
        )
    failed = [p.preset for p in result.presets if not p.ok]
    return f"{mark[False]} Byte checks FAILED for {', '.join(failed)} (in {result.seconds:.0f} s)."


def _verdict(mark, mismatched: list[str], tensors: int) -> str:
    if not mismatched:
        return f"{mark[True]} {tensors}/{tensors}"
    return f"{mark[False]} {tensors - len(mismatched)}/{tensors}, first: {mismatched[0]}"


def _fidelity_cells(by_framework: dict, mark) -> list[str]:
    cells = []
    for f in by_framework.values():
        kept = f"{mark[True]} kept" if f.ranking_preserved else f"{mark[False]} LOST"
        cells += [f"{f.mean_cosine:.5f}", f"{f.min_cosine:.5f}", kept]
    return cells


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, the others right-aligned, two spaces apart."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "   " + "  ".join([first, *rest])

    return [line(header), "   " + "-" * (sum(widths) + 2 * (len(widths) - 1))] + [
        line(r) for r in rows
    ]


# --- The PNG ---------------------------------------------------------------------------


def write_png(result, path: str) -> None:
    """One landscape page: the byte checks and the checkpoint round trip as a table, mean
    and minimum cosine per preset and framework, and each sentence pair's cosine against
    the unquantized model's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.69, 8.27))  # A4 landscape
    FigureCanvasAgg(fig)
    status = "identical bytes" if result.ok else "BYTE CHECKS FAILED"
    fig.suptitle(
        f"lowp demo: all-MiniLM-L6-v2 quantized in {' and '.join(result.frameworks)}: {status}",
        fontsize=14,
        color="black" if result.ok else "red",
    )
    fig.text(0.5, 0.915, _summary(result, _UNICODE_MARKS), ha="center", fontsize=10)
    table_height = 0.2 + 0.1 * (len(result.presets) + 1)  # the table fills its panel
    grid = fig.add_gridspec(
        2, 2, height_ratios=(table_height, 1.1), hspace=0.35, wspace=0.25, top=0.86, bottom=0.1
    )
    _draw_checks(fig.add_subplot(grid[0, :]), result)
    _draw_cosines(fig.add_subplot(grid[1, 0]), result)
    _draw_pairs(fig.add_subplot(grid[1, 1]), result)
    setup = "   ".join(f"{n} {v['version']} on {v['device']}" for n, v in result.frameworks.items())
    fig.text(
        0.5, 0.015, f"{setup}   ·   {result.seconds:.0f} s", ha="center", fontsize=8, color="0.4"
    )
    fig.savefig(path, dpi=100)


def _draw_checks(ax, result) -> None:
    torch_fw, jax_fw = result.frameworks
    ok = _UNICODE_MARKS
    header = [
        "preset",
        "tensors",
        "codes + scales",
        f"{torch_fw}\n= {jax_fw}",
        f"{torch_fw}\n= NumPy",
        f"{torch_fw} file\n-> {jax_fw}",
        f"{jax_fw} output\nfrom the file",
        f"mean cosine\n{torch_fw} / {jax_fw}",
    ]
    cells = []
    for p in result.presets:
        c = p.checkpoint
        cells.append(
            [
                p.preset,
                str(p.tensors),
                f"{p.bytes / 1e6:.2f} MB",
                ok[not p.torch_jax_mismatches],
                ok[not p.torch_numpy_mismatches],
                ok[c.quantized_match and c.plain_match and c.numpy_match],
                ok[c.embeddings_identical],
                " / ".join(f"{f.mean_cosine:.4f}" for f in p.fidelity.values()),
            ]
        )
    ax.axis("off")
    ax.set_title("Quantized weights, byte for byte, and the checkpoint round trip", fontsize=11)
    if not cells:
        return
    table = ax.table(
        cellText=cells,
        colLabels=header,
        cellLoc="center",
        colWidths=[0.19, 0.07, 0.12, 0.1, 0.1, 0.11, 0.13, 0.18],
        bbox=[0.0, 0.0, 1.0, 1.0],
    )
    table.auto_set_font_size(False)
    table.set_fontsize(10 if len(cells) <= 4 else 9)
    for (row, _), cell in table.get_celld().items():
        if row == 0:
            cell.set_facecolor("0.9")
        elif cell.get_text().get_text() in ok.values():
            good = cell.get_text().get_text() == ok[True]
            cell.get_text().set_color("green" if good else "red")
            cell.get_text().set_fontsize(13)


def _draw_cosines(ax, result) -> None:
    """Mean cosine (marker) and the lowest sentence's (end of the line) per preset and
    framework: points, not bars, since the axis does not start at zero."""
    presets = [p.preset for p in result.presets]
    offsets = [(i - (len(result.frameworks) - 1) / 2) * 0.3 for i in range(len(result.frameworks))]
    # A marker a framework ("o", "s"): the demo compares two.
    for offset, name, marker in zip(offsets, result.frameworks, "os", strict=False):
        xs = [x + offset for x in range(len(presets))]
        means = [p.fidelity[name].mean_cosine for p in result.presets]
        mins = [p.fidelity[name].min_cosine for p in result.presets]
        ax.vlines(xs, mins, means, color="0.6", linewidth=1)
        ax.scatter(xs, means, marker=marker, s=50, label=f"{name}: mean (line down to the min)")
        if len(presets) <= 4:  # more would crowd; the table above has the means too
            for x, m in zip(xs, means, strict=True):
                ax.annotate(
                    f"{m:.4f}",
                    (x, m),
                    xytext=(-6 if offset < 0 else 6, 0),  # outward, clear of the other
                    textcoords="offset points",
                    ha="right" if offset < 0 else "left",
                    va="center",
                    fontsize=7,
                )
    ax.set_xticks(range(len(presets)), presets)
    if len(presets) > 4:
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    ax.set_xlim(-0.6, len(presets) - 0.4)
    ax.axhline(1.0, color="0.8", linewidth=0.8)
    ax.set_ylabel("cosine to the unquantized model")
    ax.set_title(f"Embedding fidelity, {result.sentences} sentences", fontsize=11)
    ax.legend(loc="lower left", fontsize=8)


def _draw_pairs(ax, result) -> None:
    """Each built-in pair's cosine, quantized against unquantized: paraphrases should stay
    high and unrelated pairs low, i.e. the ranking kept."""
    first = next(iter(result.frameworks))
    reference = result.unquantized[first].pair_cosines
    paraphrase = [p.paraphrase for p in minilm.SENTENCE_PAIRS]
    markers = "osD^v<>"
    for i, p in enumerate(result.presets):
        ys = p.fidelity[first].pair_cosines
        kept = "kept" if p.fidelity[first].ranking_preserved else "LOST"
        # Not blue/orange: those are PyTorch/JAX in the panel beside this one.
        for is_para, color in ((True, "tab:green"), (False, "tab:purple")):
            x = [r for r, q in zip(reference, paraphrase, strict=True) if q == is_para]
            y = [c for c, q in zip(ys, paraphrase, strict=True) if q == is_para]
            label = f"{p.preset} (ranking {kept})" if is_para else None
            ax.scatter(x, y, marker=markers[i % len(markers)], color=color, alpha=0.7, label=label)
    lo = min([*reference, *(c for p in result.presets for c in p.fidelity[first].pair_cosines)])
    lo = math.floor(lo * 10) / 10
    ax.plot([lo, 1], [lo, 1], color="0.6", linewidth=0.8)
    ax.set_xlabel(f"pair cosine, unquantized ({first})")
    ax.set_ylabel(f"pair cosine, quantized ({first})")
    ax.set_title("Sentence pairs: paraphrases (green), unrelated (purple)", fontsize=11)
    if result.presets:
        ax.legend(loc="upper left", fontsize=8)
