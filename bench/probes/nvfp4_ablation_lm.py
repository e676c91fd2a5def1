"""Does NVFP4 training need its random Hadamard transform and stochastic rounding? The tiny
LM (`examples/train_tiny_lm`) trained with `nvfp4` and its ablation variants
(`lowp.Recipe.ablation_names()`), beside bf16, over several seeds.

    for s in 0 1 2; do   # one process a seed (one core each: OMP_NUM_THREADS=1)
      OMP_NUM_THREADS=1 python -m bench.probes.nvfp4_ablation_lm --framework torch \
          --seeds $s --steps 150 --json out/nvfp4_ablation_torch_s$s.json &
    done; wait
    python -m bench.probes.nvfp4_ablation_lm --table out/nvfp4_ablation_torch_s*.json

`--compile` (torch): each run's model `torch.compile`d. On a GPU the eager NVFP4 step is
launch-bound (the Hopper GEMMs are emulated and the casts, transform and stochastic bits
are elementwise torch ops: the `small` size did not reach 2000 steps in 270 s on the
H200), and compiled those ops fuse; lowp's casts give the eager bytes either way, the
bf16 ops around them may round in another order. A file holds eager or compiled runs,
never both. On the CPU, torch 2.13's Inductor fails on the NVFP4 step (an assertion in
its loop split, after ~9 minutes of compiling): a GPU option.

A seed (`tinylm.Config.seed`) picks the initial weights and the batch order; every run of
one seed starts from the same weights and reads the same batches, so runs differ only in
the recipe. The recipe's own seed (signs, stochastic bits) stays 0. Prints and writes each
run's final held-out loss; `--table` prints, per framework and run, the mean and the
spread (min..max) over seeds of the held-out loss and of its ratio to the same seed's
bf16 run (files of one framework merged; only seeds every run finished), and per run
the paired difference, seed by seed, of `nvfp4`'s ratio minus the run's: its mean, its
standard error and on how many seeds `nvfp4` was lower. A rerun with
the same --json skips the rows it holds. Nothing is checkpointed (`tinylm.train`'s resume check is not the question).
"""

import argparse
import dataclasses
import json
import pathlib
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_tiny_lm"
RUNS = ("bf16", "nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_plain")


def train_one(trainer_cls, cfg, run: str, corpus, device: str, compiled: bool = False) -> float:
    """The final held-out loss of `run` trained for `cfg.steps` steps on `device`, the
    model `torch.compile`d where `compiled`."""
    import tinylm

    trainer = trainer_cls(cfg, run, tinylm.init_params(cfg, cfg.seed), device)
    if compiled:
        import torch

        trainer.model = torch.compile(trainer.model)
    for step in range(cfg.steps):
        loss = trainer.step(step, tinylm.train_batch(corpus, cfg, step))
        if not np.isfinite(loss):
            raise FloatingPointError(f"{run}: loss {loss} at step {step}")
    return float(np.mean([trainer.eval_loss(b) for b in tinylm.heldout_batches(corpus, cfg)]))


def train(args) -> None:
    sys.path.insert(0, str(HERE))
    import tinylm

    if args.framework == "torch":
        import torch
        import train_torch as module

        if args.device == "cpu":
            torch.set_num_threads(1)  # one process a seed, one core each
    else:
        import train_jax as module
    cfg = tinylm.SIZES[args.size]
    cfg = dataclasses.replace(cfg, steps=args.steps, warmup=max(1, args.steps // 10))
    out = pathlib.Path(args.json)
    rows = []
    if out.exists():
        earlier = json.loads(out.read_text())
        if (earlier["config"], earlier["framework"], earlier.get("compiled", False)) != (
            dataclasses.asdict(cfg),
            args.framework,
            args.compile,
        ):
            raise SystemExit(
                f"{out} holds runs of another configuration, framework or --compile setting"
            )
        rows = earlier["rows"]
    corpus = tinylm.Corpus.load()
    done = {(r["seed"], r["run"]) for r in rows}
    for seed in map(int, args.seeds.split(",")):
        for run in args.runs.split(","):
            if (seed, run) in done:
                continue
            start = time.process_time()
            loss = train_one(
                module.Trainer,
                dataclasses.replace(cfg, seed=seed),
                run,
                corpus,
                args.device,
                args.compile,
            )
            row = {"seed": seed, "run": run, "heldout": loss, "cpu_s": time.process_time() - start}
            print(f"{args.framework} seed {seed} {run:>14} held-out {loss:.4f}", flush=True)
            rows.append(row)
            config = dataclasses.asdict(cfg)
            report = {"framework": args.framework, "config": config, "rows": rows}
            out.write_text(json.dumps(report | {"compiled": args.compile}))


def table(paths: list[str], wanted: list[str]) -> None:
    """The table of the `wanted` runs in the --json files `paths`; files of one framework
    (and one configuration: refused otherwise) are merged, so seeds may run in separate
    processes."""
    merged: dict[str, dict] = {}
    for path in paths:
        report = json.loads(pathlib.Path(path).read_text())
        compiled = report.get("compiled", False)
        into = merged.setdefault(
            report["framework"], {"config": report["config"], "compiled": compiled, "rows": []}
        )
        if (into["config"], into["compiled"]) != (report["config"], compiled):
            raise SystemExit(
                f"{path}: another configuration or --compile setting than the other "
                f"{report['framework']} files"
            )
        into["rows"] += report["rows"]
    for framework, report in merged.items():
        mode = "torch.compile'd" if report["compiled"] else "eager"
        print(f"{framework}: {mode}, config {report['config']}")
    print(
        "| framework | run | held-out loss, mean (min..max) | ratio to bf16, mean (min..max) "
        "| `nvfp4`'s ratio minus this run's, mean ± s.e. (seeds where `nvfp4` is lower) |"
    )
    print("|---|---|---|---|---|")
    for framework, report in merged.items():
        by = {(r["run"], r["seed"]): r["heldout"] for r in report["rows"]}
        runs = [run for run in wanted if any(r == run for r, _ in by)]
        # only the seeds every run finished: the runs of one seed are paired
        seeds = sorted(s for s in {s for _, s in by} if all((run, s) in by for run in runs))
        if "bf16" not in runs or not seeds:
            raise SystemExit(f"{framework}: no seed has bf16 and every run of {runs}")
        ratios = {run: np.array([by[run, s] / by["bf16", s] for s in seeds]) for run in runs}
        for run in runs:
            loss = np.array([by[run, s] for s in seeds])
            ratio = ratios[run]
            versus = ""
            if "nvfp4" in ratios and run not in ("bf16", "nvfp4") and len(seeds) > 1:
                d = ratios["nvfp4"] - ratio  # paired by seed: negative favours nvfp4
                se = d.std(ddof=1) / np.sqrt(len(d))
                versus = f"{d.mean():+.4f} ± {se:.4f} ({int((d < 0).sum())} of {len(d)})"
            print(
                f"| {framework} | `{run}` | {loss.mean():.4f} "
                f"({loss.min():.4f}..{loss.max():.4f}) | {ratio.mean():.4f} "
                f"({ratio.min():.4f}..{ratio.max():.4f}), seeds {seeds} | {versus} |"
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "jax"), default="torch")
    parser.add_argument("--runs", default=",".join(RUNS), help="to train, or to tabulate")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile each run's model")
    parser.add_argument("--json", help="append each run's row here (a rerun skips rows it has)")
    parser.add_argument("--table", nargs="+", help="print the table of these --json files")
    args = parser.parse_args(argv)
    if args.compile and args.framework != "torch":
        parser.error("--compile is for --framework torch (the JAX step is jitted already)")
    if args.table:
        table(args.table, args.runs.split(","))
    elif args.json:
        train(args)
    else:
        parser.error("give --json (train) or --table (summarize)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
