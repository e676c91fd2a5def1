"""The run's summary of the targets, the form bench/results/h200.json holds, and its table.

Built from the sections' rows alone, so one run's results file, or several (a run
split over two GPU calls), give the same summary. Speed ratios are "how many times
faster than bf16": bf16 time over the variant's time, against the faster of bf16
eager and bf16 compiled measured in the same run where both were measured. The four
keys of the targets come first; everything after them is
detail.
"""

CAST_SCHEMES = ("tensorwise", "rowwise", "mxfp8")
FLOAT8_RECIPES = ("float8_tensorwise", "float8_rowwise", "float8_rowwise_gw_hp")


def shape_key(row: dict) -> str:
    return f"{row['M']}x{row['K']}x{row['N']}"


def _ratio(reference_ms, ms):
    if reference_ms is None or ms is None:
        return None
    return round(reference_ms / ms, 3)


def _fastest_bf16(rows) -> dict:
    """shape -> the fastest bf16 time over the modes measured."""
    best = {}
    for row in rows:
        if row["impl"] == "bf16" and row["ms"] is not None:
            key = shape_key(row)
            best[key] = min(best.get(key, row["ms"]), row["ms"])
    return best


def build(sections: dict) -> dict:
    """sections: name -> a `_record.Section.as_dict()` (plus "extra" for casts)."""

    def rows(name):
        return sections.get(name, {}).get("rows", [])

    linear, linear_detail = _linear(rows("linear"))
    small, slowest = _sweep(rows("sweep"))
    control = _sweep_control(rows("sweep"))
    summary = {
        "cast_fraction_of_copy": _casts(rows("casts")),
        "linear_fwd_bwd_speedup_vs_bf16": linear,
        "jax_dense_fwd_bwd_speedup_vs_bf16": _jax(rows("jax")),
        "slowest_vs_bf16_small_shapes": slowest["speedup_vs_bf16"] if slowest else None,
        "model_train_speedup_vs_bf16": _model_speedups(
            rows("model_train") + rows("jax_model_train")
        ),
        "model_infer_speedup_vs_bf16": _model_speedups(
            rows("model_infer") + rows("jax_model_infer")
        ),
        "moe_fwd_bwd_speedup_vs_bf16": _moe(rows("moe")),
        # --- detail ---
        "linear_fwd_bwd_detail": linear_detail,
        "slowest_small_shape": slowest,
        "small_shapes_speedup_vs_bf16": small,
        # the same ratio for a second bf16 layer timed beside them: the timing noise
        "small_shapes_bf16_control_vs_bf16": control,
        "slowest_bf16_control_vs_bf16": min(_values(control), default=None),
        "fastest_bf16_control_vs_bf16": max(_values(control), default=None),
        "cast_fraction_of_copy_by_path": _casts_by_path(rows("casts")),
        "model_train_compile_s": _model_compile_s(rows("model_train") + rows("jax_model_train")),
        "model_infer_compile_s": _model_compile_s(rows("model_infer") + rows("jax_model_infer")),
        "block_step": _block(rows("block")),
        "memory_peak": _memory(rows("memory")),
        "gemm_forward_speedup_vs_bf16": _gemm(rows("gemm")),
        "numerics_only": sorted(
            {
                row["recipe"]
                for name in ("linear", "jax", "sweep", "moe")
                for row in rows(name)
                if row.get("numerics_only")
            }
        ),
        "incomplete": {
            name: {"skipped": len(s["skipped"]), "errors": len(s["errors"])}
            for name, s in sections.items()
            if s.get("skipped") or s.get("errors")
        },
    }
    return summary


def _model_speedups(rows) -> dict:
    """{framework: {T: {variant: {mode: ratio}}}}: the faster bf16 of each framework and T
    (eager or compiled) over the variant's time (bench/model.py's and jax_model.py's rows);
    a "cudagraphs" row over bf16's cudagraphs row, which the others are not compared with."""
    out: dict = {}
    for framework, tokens in sorted({(r["framework"], r["T"]) for r in rows}):
        at = [r for r in rows if (r["framework"], r["T"]) == (framework, tokens) and r["ms"]]
        bf16 = {}
        for r in at:
            if r["variant"] == "bf16":
                graphs = r["mode"] == "cudagraphs"
                bf16[graphs] = min(bf16.get(graphs, r["ms"]), r["ms"])
        for r in at:
            base = bf16.get(r["mode"] == "cudagraphs")
            if base is not None and r["variant"] != "bf16":
                entry = out.setdefault(framework, {}).setdefault(str(tokens), {})
                entry.setdefault(r["variant"], {})[r["mode"]] = _ratio(base, r["ms"])
    return out


def _model_compile_s(rows) -> dict:
    """{framework: {T: {variant: seconds}}}: a compiled (or jitted) variant's first call."""
    out: dict = {}
    for r in rows:
        if r["mode"] in ("compiled", "jit"):
            entry = out.setdefault(r["framework"], {}).setdefault(str(r["T"]), {})
            entry[r["variant"]] = r["first_call_s"]
    return out


def _moe(rows) -> dict:
    """{recipe: {shape routing: {mode: bf16 ms / ms}}} of the rows of one run: the
    "moe_fwd_bwd_speedup_vs_bf16" of bench/moe.py's rows (JAX's are "jax_lowp")."""
    bf16 = {(r["shape"], r["routing"], r["mode"]): r["ms"] for r in rows if r["recipe"] == "bf16"}
    out: dict = {}
    for r in rows:
        if r["recipe"] == "bf16":
            continue
        base = bf16.get((r["shape"], r["routing"], r["mode"]))
        name = r["recipe"] if r["impl"] == "lowp" else f"{r['impl']} {r['recipe']}"
        cell = out.setdefault(name, {}).setdefault(f"{r['shape']} {r['routing']}", {})
        cell[r["mode"]] = round(base / r["ms"], 3) if base and r["ms"] else None
    return out


def _casts(rows) -> dict:
    """The fused (Triton, eager) path's fraction of copy bandwidth per target scheme."""
    found = {r["scheme"]: r["fraction_of_copy"] for r in rows if r["path"] == "triton"}
    return {scheme: found.get(scheme) for scheme in CAST_SCHEMES}


def _casts_by_path(rows) -> dict:
    out = {}
    for r in rows:
        out.setdefault(r["scheme"], {})[r["path"]] = r["fraction_of_copy"]
    return out


def _linear(rows):
    """The targets' {recipe: {shape: {eager, compiled, torchao_compiled, limit}}}, and the
    detail: torchao eager, each variant's time as a fraction of the limit's (the target
    asks >= 0.9), the GEMM kernels, and the milliseconds behind every ratio."""
    bf16 = _fastest_bf16(rows)
    ms = {}  # (recipe, shape, variant) -> ms
    info = {}  # (recipe, shape) -> the lowp eager row's kernels
    for row in rows:
        if row["impl"] == "bf16":
            continue
        key = shape_key(row)
        variant = {"lowp": row["mode"], "torchao": f"torchao_{row['mode']}", "limit": "limit"}[
            row["impl"]
        ]
        ms[row["recipe"], key, variant] = row["ms"]
        if row["impl"] == "lowp" and row["mode"] == "eager":
            info[row["recipe"], key] = row
    recipes = sorted({recipe for recipe, _, _ in ms}, key=_recipe_order)
    shapes = sorted({shape for _, shape, _ in ms} | set(bf16), key=_shape_order)
    summary, detail = {}, {}
    for recipe in recipes:
        for shape in shapes:
            if not any((recipe, shape, v) in ms for v in ("eager", "compiled", "limit")):
                continue
            reference = bf16.get(shape)

            def speedup(variant, recipe=recipe, shape=shape, reference=reference):
                return _ratio(reference, ms.get((recipe, shape, variant)))

            summary.setdefault(recipe, {})[shape] = {
                "eager": speedup("eager"),
                "compiled": speedup("compiled"),
                "torchao_compiled": speedup("torchao_compiled"),
                "limit": speedup("limit"),
            }
            limit = ms.get((recipe, shape, "limit"))
            row = info.get((recipe, shape), {})
            detail.setdefault(recipe, {})[shape] = {
                "torchao_eager": speedup("torchao_eager"),
                "eager_of_limit": _ratio(limit, ms.get((recipe, shape, "eager"))),
                "compiled_of_limit": _ratio(limit, ms.get((recipe, shape, "compiled"))),
                "ms": {
                    v: ms.get((recipe, shape, v))
                    for v in ("eager", "compiled", "torchao_compiled", "torchao_eager", "limit")
                }
                | {"bf16_fastest": reference},
                "gemms": row.get("gemms"),
                "casts": row.get("casts"),
                "numerics_only": row.get("numerics_only"),
            }
    bf16_ms = {}
    for row in rows:
        if row["impl"] == "bf16":
            bf16_ms.setdefault(shape_key(row), {})[row["mode"]] = row["ms"]
    return summary, {"bf16_ms": bf16_ms, "recipes": detail}


def _jax(rows) -> dict:
    bf16 = {shape_key(r): r["ms"] for r in rows if r["impl"] == "bf16"}
    out = {}
    for row in rows:
        if row["impl"] != "bf16":
            out.setdefault(row["recipe"], {})[shape_key(row)] = _ratio(
                bf16.get(shape_key(row)), row["ms"]
            )
    return out


def _sweep(rows):
    """{recipe: {mode: {shape: ratio}}} for the float8 recipes, and the slowest entry."""
    bf16 = _fastest_bf16(rows)
    table, slowest = {}, None
    for row in rows:
        if row["impl"] != "lowp" or row["recipe"] not in FLOAT8_RECIPES:
            continue
        ratio = _ratio(bf16.get(shape_key(row)), row["ms"])
        table.setdefault(row["recipe"], {}).setdefault(row["mode"], {})[shape_key(row)] = ratio
        if ratio is not None and (slowest is None or ratio < slowest["speedup_vs_bf16"]):
            slowest = {
                "recipe": row["recipe"],
                "mode": row["mode"],
                "shape": shape_key(row),
                "speedup_vs_bf16": ratio,
            }
    return table, slowest


def _values(table: dict) -> list:
    """The ratios of a {mode: {shape: ratio}} table, None left out."""
    return [r for modes in table.values() for r in modes.values() if r is not None]


def _sweep_control(rows) -> dict:
    """{mode: {shape: ratio}} of a layer identical to bf16, against the same bf16 time
    the float8 rows are compared with (`_sweep`): any distance from 1 is the timing's
    noise at that shape."""
    bf16 = _fastest_bf16(rows)
    table = {}
    for row in rows:
        if row["impl"] == "bf16_control":
            ratio = _ratio(bf16.get(shape_key(row)), row["ms"])
            table.setdefault(row["mode"], {})[shape_key(row)] = ratio
    return table


def _block(rows) -> dict:
    """{recipe: {mode: {ms, speedup_vs_bf16, peak_mib}}} against the fastest bf16 step."""
    timed = [r["ms"] for r in rows if r["recipe"] == "bf16" and r["ms"] is not None]
    bf16 = min(timed) if timed else None
    out = {}
    for row in rows:
        out.setdefault(row["recipe"], {})[row["mode"]] = {
            "ms": row["ms"],
            "speedup_vs_bf16": _ratio(bf16, row["ms"]),
            "peak_mib": row["peak_mib"],
        }
    return out


def _memory(rows) -> dict:
    """{recipe: {peak_mib, step_extra_mib, peak_vs_bf16}} for the eager training step."""
    bf16 = next((r for r in rows if r["recipe"] == "bf16"), None)
    out = {}
    for row in rows:
        peak_vs = None
        if bf16 and bf16["peak_mib"] and row["peak_mib"] is not None:
            peak_vs = round(row["peak_mib"] / bf16["peak_mib"], 3)
        out[row["recipe"]] = {
            "mode": row["mode"],
            "peak_mib": row["peak_mib"],
            "step_extra_mib": row["step_extra_mib"],
            "peak_vs_bf16": peak_vs,
        }
    return out


def _gemm(rows) -> dict:
    out = {}
    for row in rows:
        if row["preset"] != "bf16":
            out.setdefault(row["preset"], {}).setdefault(row["mode"], {})[shape_key(row)] = row[
                "speedup_vs_bf16"
            ]
    return out


def _recipe_order(name):
    order = ("float8_tensorwise", "float8_rowwise", "float8_rowwise_gw_hp", "mxfp8", "mxfp8_gw_hp")
    return (order.index(name) if name in order else len(order), name)


def _shape_order(key):
    return tuple(-int(d) for d in key.split("x"))


def _num(r, width=7) -> str:
    return f"{'-':>{width}}" if r is None else f"{r:{width}.3f}"


def format_table(summary: dict) -> str:
    """The summary as the lines a person reads at the end of a run."""
    lines = []
    casts = summary["cast_fraction_of_copy"]
    if any(v is not None for v in casts.values()):
        lines.append(
            "casts (fused path, fraction of copy bandwidth; target >= 0.85): "
            + ", ".join(f"{k} {_num(v, 5).strip()}" for k, v in casts.items())
        )
    linear = summary["linear_fwd_bwd_speedup_vs_bf16"]
    if linear:
        lines.append(
            "Linear forward+backward, x faster than the fastest bf16 (eager/compiled):\n"
            f"{'recipe':>22} {'MxKxN':>18} {'eager':>7} {'compiled':>8} {'ao comp':>7} "
            f"{'ao eager':>8} {'limit':>7} {'eag/lim':>7} {'cmp/lim':>7}"
        )
        detail = summary["linear_fwd_bwd_detail"]["recipes"]
        for recipe, shapes in linear.items():
            for shape, r in shapes.items():
                d = detail[recipe][shape]
                note = "  numerics only (emulated)" if d["numerics_only"] else ""
                lines.append(
                    f"{recipe:>22} {shape:>18} {_num(r['eager'])} {_num(r['compiled'], 8)} "
                    f"{_num(r['torchao_compiled'])} {_num(d['torchao_eager'], 8)} "
                    f"{_num(r['limit'])} {_num(d['eager_of_limit'])} "
                    f"{_num(d['compiled_of_limit'])}{note}"
                )
    jax_table = summary["jax_dense_fwd_bwd_speedup_vs_bf16"]
    if jax_table:
        lines.append("JAX dense forward+backward, x faster than bf16 JAX:")
        for recipe, shapes in jax_table.items():
            cells = ", ".join(f"{s} {_num(r, 5).strip()}" for s, r in shapes.items())
            lines.append(f"{recipe:>22}: {cells}")
    slowest = summary["slowest_small_shape"]
    if slowest:
        lines.append(
            f"small-shape sweep: slowest float8 vs bf16 = {slowest['speedup_vs_bf16']:.3f}x "
            f"({slowest['recipe']} {slowest['mode']} at {slowest['shape']}; target >= 1)"
        )
    if summary["slowest_bf16_control_vs_bf16"] is not None:
        lines.append(
            "  its noise: a second bf16 layer timed beside them ran at "
            f"{summary['slowest_bf16_control_vs_bf16']:.3f}x-"
            f"{summary['fastest_bf16_control_vs_bf16']:.3f}x of bf16 over the shapes"
        )
    if summary["block_step"]:
        lines.append("transformer block training step:")
        for recipe, modes in summary["block_step"].items():
            for mode, b in modes.items():
                peak = "" if b["peak_mib"] is None else f", peak {b['peak_mib']:.0f} MiB"
                ms = "-" if b["ms"] is None else f"{b['ms']:.3f} ms"
                lines.append(
                    f"{recipe:>22} {mode:>8}: {ms} (x{_num(b['speedup_vs_bf16'], 5).strip()}){peak}"
                )
    if any(m["peak_mib"] is not None for m in summary["memory_peak"].values()):
        lines.append("peak memory of an eager block training step:")
        for recipe, m in summary["memory_peak"].items():
            peak = "-" if m["peak_mib"] is None else f"{m['peak_mib']:.0f} MiB"
            lines.append(f"{recipe:>22}: {peak} (x{_num(m['peak_vs_bf16'], 5).strip()} of bf16)")
    if summary["numerics_only"]:
        lines.append(f"numerics only (emulated GEMMs, no speed target): {summary['numerics_only']}")
    if summary["incomplete"]:
        lines.append(f"incomplete sections (skipped / failed items): {summary['incomplete']}")
    return "\n".join(lines)
