"""Train the tiny LM in PyTorch and JAX, bf16 and every lowp recipe, and compare.

    python examples/train_tiny_lm/run.py [--size tiny] [--steps N] [--device gpu] [--out DIR]

Runs `train_torch.py` and `train_jax.py` (on the CPU side by side, one core each: the
default tiny run is sized for a 2-core machine), then writes to
`--out` (default `out/train_tiny_lm/`, which git ignores at the repository root):

  losses.png    training loss of every run in both frameworks, and its ratio to bf16
  results.json  the table below, and every run's losses
  torch.json, jax.json   what each framework script wrote

and prints the table: per framework and run, the loss at step 0 (the same weights and
batch in both frameworks, so the same number to about 1e-5), the final training loss
(mean of the last 20 steps, which every run took on the same batches), the final
held-out loss, each one's ratio to the same framework's bf16 run, whether both ratios
are within 3% of 1 (the bar the docs set), whether resuming from the mid-run checkpoint
reproduced the losses and weights bit for bit, and the training time.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import tinylm

HERE = pathlib.Path(__file__).resolve().parent
FRAMEWORKS = ("torch", "jax")
TOLERANCE = 0.03  # a recipe's final loss must be within 3% of bf16's
TAIL = 20  # the final training loss averages this many last steps


def train_both(args, out: pathlib.Path) -> dict:
    """Run both framework scripts; their results by framework name.

    On the CPU they run side by side, one core each: OpenMP threads that outnumber
    free cores spin against each other (two torch threads beside a busy JAX process
    ran 10x slower than one). On a GPU they run one after the other: neither's timing
    includes the other's kernels, and JAX's memory preallocation does not starve torch.
    """
    env = dict(os.environ)
    if args.device == "cpu":
        env |= {
            "OMP_NUM_THREADS": "1",
            "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
        }
    common = ["--size", args.size, "--device", args.device, "--runs", args.runs]
    if args.steps:
        common += ["--steps", str(args.steps)]
    if args.deterministic:
        common.append("--deterministic")
    procs = {}
    for fw in FRAMEWORKS:
        command = [
            sys.executable,
            str(HERE / f"train_{fw}.py"),
            *common,
            "--json",
            str(out / f"{fw}.json"),
        ]
        procs[fw] = subprocess.Popen(command, env=env)
        if args.device != "cpu":
            procs[fw].wait()
    for fw, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"train_{fw}.py failed (exit status {proc.returncode})")
    return {fw: json.loads((out / f"{fw}.json").read_text()) for fw in FRAMEWORKS}


def final_train_loss(losses: list) -> float:
    return float(np.mean(losses[-TAIL:]))


def table(results: dict) -> list[dict]:
    """One row per framework and run; ratios against that framework's bf16 run."""
    rows = []
    for fw, report in results.items():
        base = report["runs"].get("bf16")
        for run, r in report["runs"].items():
            row = {
                "framework": fw,
                "run": run,
                "step0_loss": r["train_loss"][0],
                "final_train_loss": final_train_loss(r["train_loss"]),
                "final_heldout_loss": r["heldout"][-1][1],
                "resume_exact": r["resume_exact"],
                "seconds": r["seconds"],
                "cpu_seconds": r["cpu_seconds"],
            }
            if base is not None:
                train = row["final_train_loss"] / final_train_loss(base["train_loss"])
                heldout = row["final_heldout_loss"] / base["heldout"][-1][1]
                row |= {
                    "train_ratio": train,
                    "heldout_ratio": heldout,
                    "within_3pct": max(abs(train - 1), abs(heldout - 1)) <= TOLERANCE,
                }
            rows.append(row)
    return rows


def cross_framework(results: dict) -> str:
    """The final held-out loss of JAX over PyTorch's, per run: same weights, batches and
    precision, so the two trajectories should end close together."""
    torch_runs, jax_runs = results["torch"]["runs"], results["jax"]["runs"]
    ratios = [
        f"{run} {jax_runs[run]['heldout'][-1][1] / torch_runs[run]['heldout'][-1][1]:.4f}"
        for run in torch_runs
    ]
    return "held-out loss, jax / torch: " + ", ".join(ratios)


# (heading, format spec of its width and alignment, the cell of a row); "-" where a
# row lacks the key.
_COLUMNS = [
    ("framework", "<9", lambda r: r["framework"]),
    ("run", "<20", lambda r: r["run"]),
    ("step 0", ">7", lambda r: f"{r['step0_loss']:.4f}"),
    ("train", ">7", lambda r: f"{r['final_train_loss']:.4f}"),
    ("held-out", ">8", lambda r: f"{r['final_heldout_loss']:.4f}"),
    ("train/bf16", ">10", lambda r: f"{r['train_ratio']:.4f}"),
    ("held/bf16", ">9", lambda r: f"{r['heldout_ratio']:.4f}"),
    ("3%", ">4", lambda r: "pass" if r["within_3pct"] else "FAIL"),
    ("resume", ">6", lambda r: {True: "exact", False: "DIFFER", None: "-"}[r["resume_exact"]]),
    ("wall s", ">6", lambda r: f"{r['seconds']:.0f}"),
    ("CPU s", ">6", lambda r: f"{r['cpu_seconds']:.0f}"),
]


def format_table(rows: list[dict]) -> str:
    def cell(row, spec, write):
        try:
            text = write(row)
        except KeyError:
            text = "-"
        return f"{text:{spec}}"

    header = " ".join(f"{name:{spec}}" for name, spec, _ in _COLUMNS)
    lines = [header, "-" * len(header)]
    lines += [" ".join(cell(row, spec, write) for _, spec, write in _COLUMNS) for row in rows]
    return "\n".join(lines)


def plot(results: dict, path: pathlib.Path) -> None:
    """Loss curves (top) and their ratio to bf16 (bottom), one column per framework;
    curves are moving averages over TAIL steps, held-out losses are dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2, len(results), figsize=(6 * len(results), 8), sharex=True, squeeze=False
    )
    kernel = np.ones(TAIL) / TAIL
    for col, (fw, report) in enumerate(results.items()):
        runs = report["runs"]
        base = np.convolve(runs["bf16"]["train_loss"], kernel, "valid") if "bf16" in runs else None
        for i, (run, r) in enumerate(runs.items()):
            color = f"C{i}"
            smooth = np.convolve(r["train_loss"], kernel, "valid")
            steps = np.arange(TAIL, len(r["train_loss"]) + 1)
            axes[0, col].plot(steps, smooth, color=color, label=run, lw=1)
            held_steps, held = zip(*r["heldout"], strict=False)
            axes[0, col].plot(held_steps, held, "o", color=color, ms=3)
            if base is not None:
                axes[1, col].plot(steps, smooth / base, color=color, lw=1)
        axes[0, col].set(
            title=f"{fw}: training loss ({TAIL}-step mean), held-out (dots)",
            ylabel="loss (nats/byte)",
        )
        axes[1, col].set(
            xlabel="step", ylabel="loss / bf16 loss", ylim=(1 - 2 * TOLERANCE, 1 + 2 * TOLERANCE)
        )
        for bound in (1 - TOLERANCE, 1 + TOLERANCE):
            axes[1, col].axhline(bound, color="gray", ls=":", lw=1)
        axes[0, col].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size",
        default="tiny",
        choices=tinylm.SIZES,
        help="tiny for the CPU; small, medium for a GPU",
    )
    parser.add_argument("--steps", type=int, help="override the size's step count")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "cuda"))
    parser.add_argument(
        "--runs", default=",".join(tinylm.RUNS), help="comma-separated: bf16 and/or recipe names"
    )
    parser.add_argument("--out", default="out/train_tiny_lm", help="directory for the PNG and JSON")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic GPU kernels in both frameworks (exact resume on a GPU too)",
    )
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results = train_both(args, out)
    minutes = (time.perf_counter() - start) / 60
    rows = table(results)
    print(format_table(rows))
    print(cross_framework(results))
    print(f"{args.size} on {args.device}: {minutes:.1f} min in all")
    (out / "results.json").write_text(json.dumps({"table": rows, "runs": results}, indent=1))
    plot(results, out / "losses.png")
    print(f"wrote {out / 'losses.png'} and {out / 'results.json'}")
    failed = [
        f"{r['framework']} {r['run']}"
        for r in rows
        if r.get("within_3pct") is False or r["resume_exact"] is False
    ]
    if failed:
        print(f"not within 3% of bf16 or not resumed exactly: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
