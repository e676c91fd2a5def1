"""Sharded training with lowp on CPU: FSDP2 with fp8 all-gather (its checkpoint then
loaded into one process), then tensor parallel (training, and a `quantize_`'d model
served), each on two gloo processes, then JAX's
FSDP-style gather on four host devices, saved and resharded onto two.

    python examples/sharded_training.py            # all three
    python examples/sharded_training.py --only fsdp|tp|jax

On GPUs swap "gloo"/"cpu" for "nccl"/"cuda" (and torchrun for the spawn); nothing else
changes. docs/sharding.md explains each part.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn

import lowp_torch


def model(recipe: str) -> nn.Module:
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    return lowp_torch.convert_to_training(layers, recipe)


def fsdp(rank: int, ranks: int, checkpoint: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ranks,))
    net = model("float8_rowwise")
    # Before fully_shard: each weight gathers as fp8 codes and scales, the forward's
    # orientation before the forward and the dgrad's before the backward.
    lowp_torch.fsdp_quantized_all_gather(net)
    for layer in net:
        if isinstance(layer, lowp_torch.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    torch.manual_seed(1 + rank)  # each rank its own data
    for step in range(3):
        loss = net(torch.randn(64, 256)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"fsdp step {step}: loss {loss.item():.5f}")
    dcp.save(net.state_dict(), checkpoint_id=checkpoint)  # the float model's values


def load_unsharded(checkpoint: str) -> None:
    """The two-rank checkpoint into one process (any number of ranks loads it alike)."""
    import torch.distributed.checkpoint as dcp

    net = model("float8_rowwise")
    state = net.state_dict()
    dcp.load(state, checkpoint_id=checkpoint)
    net.load_state_dict(state)
    print(
        f"fsdp checkpoint loaded into one process: {sum(p.numel() for p in state.values())} values"
    )


def tensor_parallel(rank: int, ranks: int, checkpoint: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (ranks,))
    net = model("mxfp8")  # MX blocks of 32 divide 512 / 2 and 256 / 2: every block in a shard
    parallelize_module(net, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    torch.manual_seed(1)  # the same data on every rank
    loss = net(torch.randn(64, 256)).square().mean()
    loss.backward()
    if rank == 0:
        print(f"tp: loss {loss.item():.5f}")

    # Inference: a quantize_'d model (whole on every rank), each rank keeping its slice
    # of the quantized weights; the colwise layer's output is the whole model's columns.
    torch.manual_seed(0)
    served = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))
    lowp_torch.quantize_(served, "mxfp8")
    x = torch.randn(8, 256)
    with torch.no_grad():
        whole = served[0](x).chunk(ranks, dim=-1)[rank]
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        lowp_torch.parallelize_quantized(served, mesh, plan)
        same = torch.equal(served[0](x), whole)
        y = served(x)
    if rank == 0:
        print(f"tp inference: fc1 columns equal the unsharded layer's: {same}; y {tuple(y.shape)}")


def _entry(rank, what, ranks, d):
    torch.set_num_threads(1)
    rendezvous = f"file://{os.path.join(d, 'rendezvous')}"
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=ranks)
    try:
        {"fsdp": fsdp, "tp": tensor_parallel}[what](rank, ranks, os.path.join(d, "checkpoint"))
    finally:
        dist.destroy_process_group()


JAX = """
import jax, jax.numpy as jnp, numpy as np, lowp, lowp_jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()), ("fsdp",))
w = jax.device_put(jax.random.normal(jax.random.key(0), (512, 256), jnp.bfloat16),
                   NamedSharding(mesh, P("fsdp", None)))
scheme = lowp.MXScaling(mode="rceil")
q = jax.jit(lambda w: lowp_jax.all_gather_quantized(w, scheme, mesh, "fsdp"))(w)
same = np.array_equal(np.asarray(lowp_jax.to_lowp(q).codes).view(np.uint8),
                      np.asarray(lowp.quantize(np.asarray(w), scheme).codes).view(np.uint8))
print(f"jax: {mesh.size} devices gathered {q.codes.nbytes + q.scale.nbytes} bytes "
      f"(bf16: {w.nbytes}); codes equal lowp.quantize of the whole weight: {same}")

# Resharding goes through the interchange file: saved from four devices, placed on two.
import os, tempfile
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "w.safetensors")
    lowp.save(path, {"w": lowp_jax.to_lowp(q)})
    two = Mesh(np.array(jax.devices()[:2]), ("fsdp",))
    q2 = lowp_jax.shard_quantized(lowp_jax.from_lowp(lowp.load(path)["w"]), two, "fsdp")
    print(f"jax: reloaded on {two.size} devices, rows per device "
          f"{q2.codes.addressable_shards[0].data.shape[0]}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("fsdp", "tp", "jax"))
    what = parser.parse_args().only
    for part in ("fsdp", "tp"):
        if what in (None, part):
            with tempfile.TemporaryDirectory() as d:
                torch.multiprocessing.spawn(_entry, args=(part, 2, d), nprocs=2)
                if part == "fsdp":
                    load_unsharded(os.path.join(d, "checkpoint"))
    if what in (None, "jax"):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
        subprocess.run([sys.executable, "-c", JAX], env=env, check=True)


if __name__ == "__main__":
    main()
