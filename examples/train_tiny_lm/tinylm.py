"""What the PyTorch and JAX tiny-LM runs share: sizes, data, initial weights, schedule,
and the loop that trains, evaluates and checks resume.

Everything a run depends on is computed here, in NumPy, once: the byte stream of the
Python standard library's own sources, the batch of every step, the held-out batches,
the initial weights and the learning rate of every step. The two frameworks receive
the same arrays, so their runs differ only in how each one computes — which is the
point of comparing them.

The model (`train_torch.TinyLM`, `train_jax.TinyLM`) is a pre-LN decoder-only
transformer over bytes: token and position embeddings, `layers` blocks of causal
self-attention and a GELU MLP, a final LayerNorm and an LM head. Its four projections
per block (qkv, proj, fc1, fc2), bias-free, are what a recipe converts; the
embeddings and the LM head stay bf16, as torchtitan's float8 training leaves a
model's output layer by default (its logits feed the loss directly).

With `--ffn moe` each block's MLP is a mixture of experts instead: a float32 router
(a bias-free linear to `experts` logits, softmax, the `top_k` largest renormalised to
sum to 1) sends each token to its top_k experts, SwiGLU feed-forwards of hidden width
2 * d_model stacked as w1, w3 (E, 2d, d) and w2 (E, d, 2d); the tokens sorted by
expert go through three grouped GEMMs (`lowp_torch.GroupedExperts` /
`lowp_jax.nnx.GroupedExperts`), and the outputs are summed back weighted by their
gates. A recipe run quantizes the grouped GEMMs with the recipe (`grouped_mm`,
`ragged_dot`); the router stays float32. bf16 there: the tokens in bf16, on the CPU
multiplied in float32 by the float32 expert weights in PyTorch (GroupedExperts'
high-precision path) and by bf16 weights in JAX (`jax.lax.ragged_dot`); each recipe is
compared with its own framework's bf16.

"bf16", the baseline, means the same in both frameworks: float32 parameters, gradients
and AdamW state; every matmul (the projections, the LM head, the two attention
products) takes bf16 operands and returns bf16 (float32 accumulation inside); the
residual stream, LayerNorm, GELU, softmax and the loss run in float32. A recipe run is
the same except that the block projections quantize their bf16 input and their
float32 weight as the `lowp.Recipe` says, forward and backward.
"""

import argparse
import dataclasses
import json
import math
import pathlib
import sysconfig
import tempfile
import time

import numpy as np

import lowp

VOCAB = 256  # bytes
FFNS = ("dense", "moe")
# The ablation of NVFP4 training: the nvfp4 recipe without its random Hadamard transform
# and stochastic rounding (every operand rounded to nearest, none transformed).
ABLATIONS = {
    "nvfp4_no_rht_sr": lambda: dataclasses.replace(
        lowp.Recipe.from_name("nvfp4"),
        name="nvfp4_no_rht_sr",
        dgrad=dataclasses.replace(lowp.Recipe.from_name("nvfp4").dgrad, a_rounding="nearest"),
        wgrad=dataclasses.replace(
            lowp.Recipe.from_name("nvfp4").wgrad, a_rounding="nearest", hadamard=False
        ),
    ),
}
# the baseline, then every training recipe, then the ablations
RUNS = ("bf16",) + lowp.Recipe.names() + tuple(ABLATIONS)


def recipe_of(run: str) -> "lowp.Recipe | str":
    """What a run trains its block projections with: a recipe name, or an ablation's Recipe."""
    return ABLATIONS[run]() if run in ABLATIONS else run


@dataclasses.dataclass(frozen=True)
class Config:
    """A model size and its training schedule.

    Attributes:
      d_model, layers, heads: the transformer; the MLP is 4 * d_model wide.
      seq_len, batch: tokens per sequence, sequences per step. The recipes' wgrad GEMMs
        reduce over batch * seq_len tokens, so an MX block (32) must divide it.
      steps, warmup: optimizer steps; linear warmup, then cosine decay to lr / 10.
      lr, weight_decay, grad_clip: AdamW (betas 0.9, 0.95) with global-norm clipping.
      eval_every: steps between held-out evaluations; eval_batches: how many batches
        (fixed windows of the held-out files) one evaluation averages.
      seed: of the initial weights and of the batch order.
      ffn: "dense" (the GELU MLP) or "moe": `experts` SwiGLU experts of hidden width
        2 * d_model, `top_k` of them per token (module docstring).
    """

    d_model: int
    layers: int
    heads: int
    seq_len: int
    batch: int
    steps: int
    warmup: int
    lr: float
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = 0
    ffn: str = "dense"
    experts: int = 4
    top_k: int = 2

    def __post_init__(self):
        # Every projection dim must take an MX block of 32 (and the fp8 GEMMs' 16).
        for name, value in (
            ("d_model", self.d_model),
            ("batch * seq_len", self.batch * self.seq_len),
        ):
            if value % 32:
                raise ValueError(
                    f"{name} must be a multiple of 32 for the mxfp8 recipes, got {value}"
                )
        if self.ffn not in FFNS:
            raise ValueError(f"ffn must be one of {FFNS}, got {self.ffn!r}")
        if self.ffn == "moe" and not 0 < self.top_k <= self.experts:
            raise ValueError(f"need 0 < top_k <= experts, got {self.top_k}, {self.experts}")
        if self.d_model % self.heads:
            raise ValueError(f"heads={self.heads} must divide d_model={self.d_model}")
        if not 0 < self.warmup < self.steps:
            raise ValueError(
                f"need 0 < warmup < steps, got warmup={self.warmup}, steps={self.steps}"
            )


SIZES = {
    # The default, sized for a 2-core CPU: there, torch emulates the recipes' fp8 casts
    # bit-exactly with elementwise ops, about 0.2 s of CPU per step at this size.
    "tiny": Config(
        d_model=128,
        layers=2,
        heads=4,
        seq_len=64,
        batch=8,
        steps=300,
        warmup=30,
        lr=2e-3,
        eval_every=50,
    ),
    # For a GPU (the stdlib's ~30 MB of source gives medium about 3 epochs).
    "small": Config(
        d_model=384, layers=6, heads=6, seq_len=256, batch=32, steps=2000, warmup=100, lr=1e-3
    ),
    "medium": Config(
        d_model=768, layers=12, heads=12, seq_len=512, batch=32, steps=5000, warmup=200, lr=6e-4
    ),
}


# --- data ---


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The bytes of the Python standard library's .py files, split by file.

    Files are taken in the sorted order of their paths under the stdlib directory
    (site-packages excluded); every tenth (indices 9, 19, ...) is held out. The text
    depends on the Python that runs the script, so numbers differ between Python
    versions, never between runs of one.
    """

    train: np.ndarray  # uint8
    heldout: np.ndarray  # uint8
    files: int

    @classmethod
    def load(cls) -> "Corpus":
        stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
        paths = sorted(
            p.relative_to(stdlib)
            for p in stdlib.rglob("*.py")
            if not {"site-packages", "dist-packages"} & set(p.relative_to(stdlib).parts)
        )
        if len(paths) < 100:
            raise FileNotFoundError(
                f"expected the standard library's .py files under {stdlib}, found {len(paths)}"
            )
        texts = [(stdlib / p).read_bytes() for p in paths]
        heldout = b"".join(t for i, t in enumerate(texts) if i % 10 == 9)
        train = b"".join(t for i, t in enumerate(texts) if i % 10 != 9)
        return cls(np.frombuffer(train, np.uint8), np.frombuffer(heldout, np.uint8), len(paths))


def train_batch(corpus: Corpus, cfg: Config, step: int) -> np.ndarray:
    """The (batch, seq_len + 1) int32 windows of step `step`: a function of the seed and
    the step alone, so a resumed run reads the batches the uninterrupted one did."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(corpus.train) - cfg.seq_len - 1, size=cfg.batch)
    return _windows(corpus.train, starts, cfg.seq_len)


def heldout_batches(corpus: Corpus, cfg: Config) -> list[np.ndarray]:
    """`cfg.eval_batches` fixed batches of windows spread evenly over the held-out bytes."""
    count = cfg.eval_batches * cfg.batch
    starts = np.linspace(0, len(corpus.heldout) - cfg.seq_len - 1, count).astype(np.int64)
    return [
        _windows(corpus.heldout, s, cfg.seq_len)
        for s in starts.reshape(cfg.eval_batches, cfg.batch)
    ]


def _windows(data: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    return np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int32)


# --- weights and schedule ---


def init_params(cfg: Config, seed: int) -> dict[str, np.ndarray]:
    """The initial weights, float32, named as the PyTorch model's state_dict.

    GPT-2's initialisation: N(0, 0.02) for embeddings and projections, the residual
    projections (proj, fc2) scaled by 1/sqrt(2 * layers), LayerNorm scale 1 and shift
    0. Linear weights are (out_features, in_features); JAX transposes them into flax
    kernels (`train_jax.load_params`).
    """
    rng = np.random.default_rng(seed)
    d, std = cfg.d_model, 0.02
    residual_std = std / math.sqrt(2 * cfg.layers)

    def normal(shape, scale=std):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    params = {"tok_emb.weight": normal((VOCAB, d)), "pos_emb.weight": normal((cfg.seq_len, d))}
    for i in range(cfg.layers):
        p = f"blocks.{i}."
        params |= {
            p + "ln1.weight": np.ones(d, np.float32),
            p + "ln1.bias": np.zeros(d, np.float32),
            p + "attn.qkv.weight": normal((3 * d, d)),
            p + "attn.proj.weight": normal((d, d), residual_std),
            p + "ln2.weight": np.ones(d, np.float32),
            p + "ln2.bias": np.zeros(d, np.float32),
        }
        if cfg.ffn == "moe":
            e, h = cfg.experts, 2 * d
            params |= {
                p + "moe.router.weight": normal((e, d)),
                p + "moe.experts.w1": normal((e, h, d)),
                p + "moe.experts.w2": normal((e, d, h), residual_std),
                p + "moe.experts.w3": normal((e, h, d)),
            }
        else:
            params |= {
                p + "mlp.fc1.weight": normal((4 * d, d)),
                p + "mlp.fc2.weight": normal((d, 4 * d), residual_std),
            }
    params |= {
        "ln_f.weight": np.ones(d, np.float32),
        "ln_f.bias": np.zeros(d, np.float32),
        "head.weight": normal((VOCAB, d)),
    }
    return params


def learning_rates(cfg: Config) -> np.ndarray:
    """The learning rate of every step, float32: linear warmup, cosine decay to lr/10."""
    step = np.arange(cfg.steps, dtype=np.float64)
    warm = cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / (cfg.steps - cfg.warmup)
    decay = cfg.lr * (0.1 + 0.45 * (1 + np.cos(np.pi * np.clip(progress, 0, 1))))
    return np.where(step < cfg.warmup, warm, decay).astype(np.float32)


# --- the training loop both frameworks run ---


def train(
    make_trainer,
    cfg: Config,
    run: str,
    corpus: Corpus,
    checkpoint_dir,
    *,
    resume_at=None,
    resume_steps=10,
    log=print,
) -> dict:
    """Train one run for `cfg.steps` steps, evaluate it on the held-out batches, and
    check that resuming from a checkpoint reproduces it.

    Args:
      make_trainer: `make_trainer(cfg, run, params)` -> a trainer with `step(step,
        tokens) -> loss`, `eval_loss(tokens) -> loss`, `save(path)`, `load(path)` and
        `params() -> {name: float32 array}` (`train_torch.Trainer`, `train_jax.Trainer`).
      run: "bf16" or a recipe name (`RUNS`).
      checkpoint_dir: where the checkpoint of step `resume_at` is written.
      resume_at: the step to checkpoint (default: half way). After the run, a trainer
        built from other initial weights loads the checkpoint and repeats steps
        resume_at .. resume_at + resume_steps; its losses and weights must equal the
        first run's bit for bit. resume_steps=0 skips the check.

    Returns:
      {"train_loss": per-step losses, "heldout": [(step, loss)], "resume_exact": bool or
      None, "seconds" and "cpu_seconds": wall and process CPU time of the training
      steps (JAX's include compilation), without evaluation and the resume check}.
    """
    if run not in RUNS:
        raise ValueError(f"unknown run {run!r}; expected one of {RUNS}")
    resume_at = cfg.steps // 2 if resume_at is None else resume_at
    if resume_steps and not 0 < resume_at <= cfg.steps - resume_steps:
        raise ValueError(
            f"resume_at={resume_at} must leave resume_steps={resume_steps} of steps={cfg.steps}"
        )
    checkpoint = pathlib.Path(checkpoint_dir) / f"{run}_step{resume_at}"
    heldout = heldout_batches(corpus, cfg)
    trainer = make_trainer(cfg, run, init_params(cfg, cfg.seed))
    losses, evals, weights_after_replay = [], [], None
    seconds = cpu_seconds = 0.0
    for step in range(cfg.steps):
        if resume_steps and step == resume_at:
            trainer.save(checkpoint)
        if resume_steps and step == resume_at + resume_steps:
            weights_after_replay = trainer.params()
        start, cpu_start = time.perf_counter(), time.process_time()
        losses.append(trainer.step(step, train_batch(corpus, cfg, step)))
        seconds += time.perf_counter() - start
        cpu_seconds += time.process_time() - cpu_start
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"{run}: loss {losses[-1]} at step {step}")
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            evals.append((step + 1, float(np.mean([trainer.eval_loss(b) for b in heldout]))))
            log(
                f"{run:>20} step {step + 1:5d}  train {losses[-1]:.4f}  "
                f"held-out {evals[-1][1]:.4f}  ({seconds:.0f} s)"
            )
    resume_exact = None
    if resume_steps:
        replayed = range(resume_at, resume_at + resume_steps)
        resume_exact = _resumes_exactly(
            make_trainer(cfg, run, init_params(cfg, cfg.seed + 1)),
            checkpoint,
            {step: train_batch(corpus, cfg, step) for step in replayed},
            [losses[step] for step in replayed],
            trainer.params() if weights_after_replay is None else weights_after_replay,
        )
    return {
        "train_loss": losses,
        "heldout": evals,
        "resume_exact": resume_exact,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
    }


def _resumes_exactly(trainer, checkpoint, batches: dict, losses: list, weights: dict) -> bool:
    """Whether `trainer`, loading `checkpoint` and taking `batches` (by step), gets
    `losses` and ends with `weights`, bit for bit. The trainer starts from other
    weights than the checkpoint's, so whatever the checkpoint misses shows."""
    trainer.load(checkpoint)
    replay = [trainer.step(step, tokens) for step, tokens in batches.items()]
    got = trainer.params()
    return replay == losses and all(np.array_equal(got[k], w) for k, w in weights.items())


# --- the command line of train_torch.py and train_jax.py ---


def cli(framework: str, make_trainer, description: str, argv=None, deterministic=None) -> int:
    """Train the runs named on the command line and write their losses as JSON.

    `make_trainer(cfg, run, params, device)` builds the framework's Trainer;
    device is "cpu" or "gpu" ("cuda" is taken as "gpu"). `deterministic()`, called
    before anything runs under --deterministic, puts the framework in its deterministic
    mode (the GPU's atomics-based kernels differ from run to run; the CPU's do not).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--runs", default=",".join(RUNS), help="comma-separated: bf16 and/or recipe names"
    )
    parser.add_argument("--size", default="tiny", choices=SIZES)
    parser.add_argument(
        "--steps", type=int, help="override the size's step count (warmup: a tenth)"
    )
    parser.add_argument("--ffn", default="dense", choices=FFNS, help="the blocks' MLP")
    parser.add_argument("--experts", type=int, default=4, help="--ffn moe: experts a block")
    parser.add_argument("--top-k", type=int, default=2, help="--ffn moe: experts a token")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu", "cuda"))
    parser.add_argument("--json", help="write the losses here")
    parser.add_argument(
        "--resume-steps", type=int, default=10, help="steps of the resume check (0: none)"
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic GPU kernels, so that a resume can be exact there too",
    )
    args = parser.parse_args(argv)
    if args.deterministic:
        if deterministic is None:
            parser.error(f"--deterministic: no deterministic mode is known for {framework}")
        deterministic()
    cfg = SIZES[args.size]
    if args.steps:
        cfg = dataclasses.replace(cfg, steps=args.steps, warmup=max(1, args.steps // 10))
    cfg = dataclasses.replace(cfg, ffn=args.ffn, experts=args.experts, top_k=args.top_k)
    runs = args.runs.split(",")
    for run in runs:
        if run not in RUNS:
            parser.error(f"unknown run {run!r}; expected some of {RUNS}")
    device = "gpu" if args.device == "cuda" else args.device
    corpus = Corpus.load()
    print(f"{framework}: {args.size} {cfg}")
    print(f"{framework}: {len(corpus.train)} training bytes of {corpus.files} stdlib files")
    results = {}

    def write_json():
        # after every run, so a run cut short by a time limit keeps the ones that finished
        report = {
            "framework": framework,
            "size": args.size,
            "device": device,
            "config": dataclasses.asdict(cfg),
            "runs": results,
        }
        pathlib.Path(args.json).write_text(json.dumps(report))

    with tempfile.TemporaryDirectory() as checkpoints:
        for run in runs:
            results[run] = train(
                lambda c, r, p: make_trainer(c, r, p, device),
                cfg,
                run,
                corpus,
                checkpoints,
                resume_steps=args.resume_steps,
                log=lambda line: print(f"{framework:>5} {line}", flush=True),
            )
            seconds, exact = results[run]["seconds"], results[run]["resume_exact"]
            print(
                f"{framework:>5} {run:>20} trained in {seconds:.0f} s; resume exact: {exact}",
                flush=True,
            )
            if args.json:
                write_json()
    return 0
