"""Does a 7B-parameter bf16 checkpoint quantize shard by shard on a CPU machine of 24 GB?

Writes a synthetic Llama-2-7B-shaped checkpoint (32 layers, hidden 4096, MLP 11008,
vocab 32000: 6.74e9 bf16 parameters, 13.5 GB) as safetensors shards, one shard in memory
at a time (values: a seeded pool of normal bf16 values laid out afresh for each tensor),
then runs `lowp_apps.checkpoint.quantize_checkpoint` in a child process and reports the
child's peak RSS (`ru_maxrss`), its wall and CPU time, and the bytes written.

    PYTHONPATH=. python bench/probes/checkpoint_7b.py --dir /tmp/ckpt --scheme mx
    PYTHONPATH=. python bench/probes/checkpoint_7b.py --dir /tmp/ckpt --layers 2   # a small run

The directory is removed afterwards unless --keep.
"""

import argparse
import json
import pathlib
import resource
import shutil
import subprocess
import sys
import time

import ml_dtypes
import numpy as np

HIDDEN, MLP, VOCAB = 4096, 11008, 32000


def layer_shapes(i: int) -> dict:
    p = f"model.layers.{i}."
    shapes = {p + f"self_attn.{n}_proj.weight": (HIDDEN, HIDDEN) for n in "qkvo"}
    shapes |= {p + f"mlp.{n}_proj.weight": (MLP, HIDDEN) for n in ("gate", "up")}
    shapes[p + "mlp.down_proj.weight"] = (HIDDEN, MLP)
    shapes |= {
        p + n: (HIDDEN,) for n in ("input_layernorm.weight", "post_attention_layernorm.weight")
    }
    return shapes


def write_checkpoint(root: pathlib.Path, layers: int, per_shard: int) -> int:
    """The shards, one in memory at a time; returns the parameter count."""
    import lowp

    pool = np.random.default_rng(0).standard_normal(1 << 24, dtype=np.float32)
    pool = (pool * np.float32(0.02)).astype(ml_dtypes.bfloat16)
    groups = [range(i, min(i + per_shard, layers)) for i in range(0, layers, per_shard)]
    count = 0
    for k, group in enumerate(groups):
        shapes: dict = {}
        if k == 0:
            shapes["model.embed_tokens.weight"] = (VOCAB, HIDDEN)
        for i in group:
            shapes |= layer_shapes(i)
        if k == len(groups) - 1:
            shapes |= {"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}
        arrays = {}
        for j, (name, shape) in enumerate(shapes.items()):
            n = int(np.prod(shape))
            arrays[name] = np.resize(np.roll(pool, 7919 * j), n).reshape(shape)
            count += n
        lowp.save(root / f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors", arrays)
        del arrays
    return count


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=8, help="layers per shard")
    parser.add_argument("--scheme", default="mx", help="a lowp scheme spec")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    root = pathlib.Path(args.dir)
    src, out = root / "bf16", root / "lowp"
    src.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    params = write_checkpoint(src, args.layers, args.per_shard)
    written_s = time.perf_counter() - start
    code = (
        "import json, resource, time; import lowp.extend; from lowp_apps import checkpoint\n"
        "w, c = time.perf_counter(), time.process_time()\n"
        f"done = checkpoint.quantize_checkpoint({str(src)!r}, {str(out)!r}, "
        f"lowp.extend.from_spec({args.scheme!r}))\n"
        "print(json.dumps({'shards': done, 'wall_s': time.perf_counter() - w, "
        "'cpu_s': time.process_time() - c, "
        "'peak_rss_gib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the conversion failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    size = lambda d: sum(f.stat().st_size for f in d.iterdir()) / 2**30  # noqa: E731
    result |= {
        "parameters": params,
        "scheme": args.scheme,
        "source_gib": round(size(src), 2),
        "output_gib": round(size(out), 2),
        "largest_shard_gib": round(max(f.stat().st_size for f in src.iterdir()) / 2**30, 2),
        "write_source_s": round(written_s, 1),
        "parent_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    print(json.dumps(result, indent=1))
    if not args.keep:
        shutil.rmtree(root)
    return result


if __name__ == "__main__":
    main()
