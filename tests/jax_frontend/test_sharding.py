"""A weight sharded over four host devices, quantized shard by shard and all-gathered as
codes and scales (lowp_jax._sharding), is `lowp.quantize`'s of the whole weight."""

import jax.numpy as jnp
import pytest
from host_devices import run_on_four_cpu_devices

import lowp
from lowp_jax import _sharding

SCRIPT = """
import jax, jax.numpy as jnp, numpy as np, lowp, lowp_jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from lowp_jax import _sharding

mesh = Mesh(np.array(jax.devices()), ("fsdp",))
assert mesh.size == 4, mesh
w = jax.random.normal(jax.random.key(0), (128, 64), jnp.bfloat16).at[5, 7].set(100.0)
poisoned = w.at[40, 3].set(jnp.nan).at[90, 9].set(jnp.inf)  # NaN/Inf poison their groups
schemes = [
    lowp.TensorScaling(),
    lowp.AxisScaling(axis=-1, pow2=True),
    lowp.AxisScaling(axis=-2, pow2=True),
    lowp.MXScaling(mode="rceil"),
    lowp.MXScaling(mode="rceil", axis=-2),
]

def as_bytes(a):
    return np.asarray(a).reshape(-1).view(np.uint8)

gathers_of_w = []  # each scheme's, saved to a file below
for scheme in schemes:
    # Called eagerly on w and jitted on poisoned: both ways, one gather each.
    def gather(x):
        return _sharding.all_gather_quantized(x, scheme, mesh, "fsdp")

    for full, call in ((w, gather), (poisoned, jax.jit(gather))):
        sharded = jax.device_put(full, NamedSharding(mesh, P("fsdp", None)))
        got = lowp_jax.to_lowp(call(sharded))
        ref = lowp.quantize(np.asarray(full), scheme)
        assert np.array_equal(as_bytes(got.codes), as_bytes(ref.codes)), scheme
        assert np.array_equal(as_bytes(got.scale), as_bytes(ref.scale)), scheme
        print("equal", scheme)
        if full is w:
            gathers_of_w.append(got)

# Resharding through the interchange file: gathered on four devices and saved, the file
# is the unsharded quantize's byte for byte; loaded and placed on two devices (and on
# one), each device holds its rows' bytes, and their concatenation is the file's.
import os, tempfile
two = Mesh(np.array(jax.devices()[:2]), ("fsdp",))
with tempfile.TemporaryDirectory() as d:
    for i, (scheme, gathered) in enumerate(zip(schemes, gathers_of_w, strict=True)):
        files = [os.path.join(d, f"{i}{k}.safetensors") for k in "gr"]
        lowp.save(files[0], {"w": gathered})
        lowp.save(files[1], {"w": lowp.quantize(np.asarray(w), scheme)})
        assert open(files[0], "rb").read() == open(files[1], "rb").read(), scheme
        loaded = lowp_jax.from_lowp(lowp.load(files[0])["w"])
        for target in (two, Mesh(np.array(jax.devices()[:1]), ("fsdp",))):
            q = lowp_jax.shard_quantized(loaded, target, "fsdp")
            shards = q.codes.addressable_shards
            assert len(shards) == target.size and shards[0].data.shape == (128 // target.size, 64)
            assert np.array_equal(as_bytes(lowp_jax.to_lowp(q).codes), as_bytes(gathered.codes))
            assert np.array_equal(as_bytes(lowp_jax.to_lowp(q).scale), as_bytes(gathered.scale))
        print("resharded", scheme)
try:
    lowp_jax.shard_quantized(
        lowp_jax.quantize(w[:64], lowp.MXScaling(axis=-2)), mesh, "fsdp", name="fc2"
    )
except ValueError as e:
    assert "fc2: a shard of 16 rows splits the 32-row blocks" in str(e), e
else:
    raise AssertionError("shard_quantized cut an MX block")

small = jax.device_put(w[:64], NamedSharding(mesh, P("fsdp", None)))  # 16 rows a device
try:
    _sharding.all_gather_quantized(small, lowp.MXScaling(axis=-2), mesh, "fsdp", name="fc1")
except ValueError as e:
    assert "fc1: a shard of 16 rows" in str(e) and "32-row blocks" in str(e), e
    print("refused", e)
else:
    raise AssertionError("a shard splitting an MX block was not refused")
"""


@pytest.mark.slow  # processes spawned: seconds each
def test_gathered_codes_are_the_unsharded_quantize_on_four_devices():
    """Also: the interchange file of a gathered weight is the unsharded quantize's, and
    loads sharded onto two devices and one with those bytes."""
    out = run_on_four_cpu_devices(SCRIPT)
    assert out.count("equal") == 10 and "refused" in out, out
    assert out.count("resharded") == 5, out


@pytest.mark.parametrize("quantize", [_sharding.quantize_shard, _sharding.quantize_gathered])
def test_nvfp4_is_refused_shard_by_shard(quantize):
    """NVFP4's global scale is the whole weight's amax, which one shard does not hold."""
    with pytest.raises(ValueError, match="fc1: NVFP4's global scale is not gathered"):
        quantize(jnp.zeros((16, 64), jnp.float32), lowp.NVFP4Scaling(), "fsdp", name="fc1")
