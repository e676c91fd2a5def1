"""The backends the conformance suite compares, each present only where it can run.

| name                | what runs                                                   |
|---------------------|-------------------------------------------------------------|
| numpy               | `lowp` itself (the reference), on a non-contiguous view     |
| torch_cpu           | `lowp_torch`, eager, on the CPU                             |
| torch_cuda_eager    | `lowp_torch`, eager, on CUDA                                |
| torch_cuda_compiled | `lowp_torch` under `torch.compile` on CUDA (see below)      |
| jax_cpu             | `lowp_jax` under `jax.jit`, on the CPU device               |
| jax_gpu             | `lowp_jax` under `jax.jit`, on the GPU device               |

torch_cuda_compiled compiles with `fullgraph=True, dynamic=False` and runs the Triton
casts' custom ops, and (as an alternate) Inductor's kernels of the torch ops.

Each backend quantizes and dequantizes in one function (one graph where it compiles),
so fusion across the two is exercised as a user's code would exercise it. The numpy
column checks the reference against itself on an input with negative strides: memory
layout must never change a byte, and the column shows the cases every other backend
is compared on. torch and jax are optional dependencies of lowp: they are imported
here only inside the methods that need them, so `import lowp` never pulls them in.
"""

import contextlib
import importlib.util

import ml_dtypes
import numpy as np

import lowp
from lowp_apps.conformance import cases, compare, gemm, grouped

NAMES = ("numpy", "torch_cpu", "torch_cuda_eager", "torch_cuda_compiled", "jax_cpu", "jax_gpu")


def blockable(scheme, shape) -> bool:
    """Whether the cuBLAS scale layout applies (MX / NVFP4 along the last axis; not
    NVFP4's 2-D tiles)."""
    if scheme.family not in ("mx", "nvfp4") or not shape or not hasattr(scheme, "axis"):
        return False
    return scheme.axis % len(shape) == len(shape) - 1


class NumpyBackend:
    """The reference `lowp.quantize` / `lowp.dequantize`, fed a negatively strided view."""

    name = "numpy"
    slow_compile = False

    def problem(self) -> str | None:
        return None

    def describe(self) -> str:
        return f"numpy {np.__version__}"

    def run(self, config: cases.Configuration, x: np.ndarray, ref: lowp.QTensor) -> compare.Outputs:
        view = np.flip(np.ascontiguousarray(np.flip(x, -1)), -1) if x.ndim else x
        q = lowp.quantize(view, config.scheme, **config.rounding_kwargs())
        with np.errstate(over="ignore"):  # see compare.reference_dequantized
            dequantized = {d: lowp.dequantize(q, d) for d in config.out_dtypes}
        return compare.Outputs(q, dequantized)

    def gemm_paths(self, case, a, b) -> list:
        return []  # the reference has no GEMM of its own: it is the float64 product

    def grouped_operands(self, arrays, sizes, recipe) -> dict:
        """The reference's grouped operands, of negatively strided views."""
        views = {k: np.flip(np.ascontiguousarray(np.flip(v, -1)), -1) for k, v in arrays.items()}
        return grouped.reference(views, sizes, recipe)


class TorchBackend:
    """`lowp_torch` on one device, eagerly or under torch.compile."""

    def __init__(self, name: str, device: str, compiled: bool):
        self.name, self.device, self.compiled = name, device, compiled
        # torch.compile spends seconds per graph: such a backend runs a smaller plan.
        self.slow_compile = compiled
        self._functions = {}

    def problem(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install lowp[torch])"
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            return f"torch {torch.__version__} sees no CUDA device"
        if self.compiled and importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs triton, which is not installed"
        return None

    def describe(self) -> str:
        import torch

        where = torch.cuda.get_device_name() if self.device == "cuda" else "cpu"
        how = "torch.compile" if self.compiled else "eager"
        return f"torch {torch.__version__} {how} on {where}"

    def run(self, config, x, ref) -> compare.Outputs:
        import torch

        import lowp_torch

        t = torch.from_numpy(_int_view(x)).view(getattr(torch, config.hp_dtype)).to(self.device)
        q, got = self._outputs(config, t, "auto")
        if self.compiled and self._triton_casts(config):
            # The compiled graph calls the Triton casts; Inductor's own kernels of the
            # torch ops (cast_kernels("torch")) are the other compiled path users have.
            got["alternates"] = {
                "inductor": compare.Outputs(**self._outputs(config, t, "torch")[1])
            }
        if config.extras and not self.compiled:  # layouts and imports are eager code
            if blockable(config.scheme, config.shape):
                blocked = q.with_scale_layout("cublas_blocked")
                got["blocked"] = lowp_torch.to_lowp(blocked)
                got["blocked_dequantized"] = _torch_to_numpy(blocked.dequantize())
                got["unblocked"] = lowp_torch.to_lowp(blocked.with_scale_layout("plain"))
            imported = lowp_torch.from_lowp(ref, device=self.device)
            got["imported"] = _torch_to_numpy(imported.dequantize())
        return compare.Outputs(**got)

    def gemm_paths(self, case, a, b) -> list:
        with self._dynamo_limits():
            return gemm.torch_paths(case, a, b, self.device, self.compiled)

    def grouped_operands(self, arrays, sizes, recipe) -> dict:
        """`lowp_torch.grouped_operands` on the device (compiled, for a compiled backend)."""
        import torch

        import lowp_torch

        t = {
            k: torch.from_numpy(_int_view(v)).view(torch.bfloat16).to(self.device)
            for k, v in arrays.items()
        }
        offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device=self.device)
        fn = lowp_torch.grouped_operands
        if self.compiled:
            fn = self._functions.setdefault("grouped", torch.compile(fn, dynamic=False))
        with self._dynamo_limits():
            ops = fn(t["x"], t["w"], t["g"], offs, recipe)
        return {
            name: tuple(tuple(_byte_array(a) for a in op) for op in pair)
            for name, pair in ops.items()
            if pair is not None
        }

    def _outputs(self, config, t, kernels: str) -> tuple:
        """(the QuantizedTensor, Outputs fields) of t under cast_kernels(kernels)."""
        import lowp_torch

        with self._dynamo_limits(), lowp_torch.cast_kernels(kernels):
            q, outs = self._roundtrip(config, kernels)(t)
        dequantized = {d: _torch_to_numpy(o) for d, o in zip(config.out_dtypes, outs, strict=True)}
        return q, {"quantized": lowp_torch.to_lowp(q), "dequantized": dequantized}

    @staticmethod
    def _triton_casts(config) -> bool:
        """Whether a CUDA quantize of `config` takes the Triton casts under "auto"."""
        from lowp_torch import _cast_kernels

        kwargs = config.rounding_kwargs()
        return (
            kwargs.get("rounding", "nearest") == "nearest"
            and not kwargs.get("check_finite", False)
            and _cast_kernels.scheme_problem(config.scheme) is None
        )

    def _roundtrip(self, config, kernels: str = "auto"):
        """quantize + dequantize as one function, compiled once per scheme, rounding and
        kernel choice."""
        import lowp_torch

        kwargs = config.rounding_kwargs()
        key = (config.scheme, tuple(kwargs.items()), config.out_dtypes, kernels)
        if key not in self._functions:
            import torch

            out_dtypes = [getattr(torch, d) for d in config.out_dtypes]

            def roundtrip(t):
                q = lowp_torch.quantize(t, config.scheme, **kwargs)
                return q, tuple(lowp_torch.dequantize(q, d) for d in out_dtypes)

            if self.compiled:
                roundtrip = torch.compile(roundtrip, dynamic=False, fullgraph=True)
            self._functions[key] = roundtrip
        return self._functions[key]

    def _dynamo_limits(self):
        """Every compiled closure shares one code object, so one recompile budget (8 by
        default): raise it, and fail rather than fall back to eager if it is ever hit."""
        if not self.compiled:
            return contextlib.nullcontext()
        import torch._dynamo.config as dynamo_config

        wanted = {
            "recompile_limit": 100_000,
            "cache_size_limit": 100_000,
            "fail_on_recompile_limit_hit": True,
        }
        return dynamo_config.patch({k: v for k, v in wanted.items() if hasattr(dynamo_config, k)})


class JaxBackend:
    """`lowp_jax` under jax.jit on the first device of one platform ("cpu" or "gpu")."""

    slow_compile = False

    def __init__(self, name: str, platform: str):
        self.name, self.platform = name, platform
        self._functions = {}

    def problem(self) -> str | None:
        if importlib.util.find_spec("jax") is None:
            return "jax is not installed (pip install lowp[jax])"
        import jax

        try:
            jax.devices(self.platform)
        except RuntimeError as err:
            return (
                f"jax {jax.__version__} has no {self.platform} device ({str(err).splitlines()[0]})"
            )
        return None

    def describe(self) -> str:
        import jax

        device = self._device()
        return f"jax {jax.__version__} jit on {device.device_kind} ({device})"

    def _device(self):
        import jax

        return jax.devices(self.platform)[0]

    def run(self, config, x, ref) -> compare.Outputs:
        import jax

        import lowp_jax

        device = self._device()
        q, outs = self._roundtrip(config)(jax.device_put(x, device))
        dequantized = {d: np.asarray(o) for d, o in zip(config.out_dtypes, outs, strict=True)}
        got = {"quantized": lowp_jax.to_lowp(q), "dequantized": dequantized}
        if config.extras:
            if blockable(config.scheme, config.shape):
                blocked = q.with_scale_layout("cublas_blocked")
                got["blocked"] = lowp_jax.to_lowp(blocked)
                got["blocked_dequantized"] = np.asarray(lowp_jax.dequantize(blocked))
                got["unblocked"] = lowp_jax.to_lowp(blocked.with_scale_layout("plain"))
            imported = jax.device_put(lowp_jax.from_lowp(ref), device)
            got["imported"] = np.asarray(lowp_jax.dequantize(imported))
        return compare.Outputs(**got)

    def gemm_paths(self, case, a, b) -> list:
        return gemm.jax_paths(case, a, b, self._device())

    def grouped_operands(self, arrays, sizes, recipe) -> dict:
        """`lowp_jax.grouped_operands` under jit on the device."""
        import jax

        import lowp_jax

        if "grouped" not in self._functions:
            self._functions["grouped"] = jax.jit(lowp_jax.grouped_operands, static_argnums=4)
        device = self._device()
        x, w, g = (jax.device_put(arrays[k], device) for k in ("x", "w", "g"))
        ops = self._functions["grouped"](x, w, g, jax.device_put(sizes, device), recipe)
        return {
            name: tuple(tuple(np.ascontiguousarray(np.asarray(a)) for a in op) for op in pair)
            for name, pair in ops.items()
            if pair is not None
        }

    def _roundtrip(self, config):
        """quantize + dequantize in one jit, traced once per scheme and rounding (jit
        itself compiles once per shape and dtype)."""
        import jax

        import lowp_jax

        kwargs = config.rounding_kwargs()
        key = (config.scheme, tuple(kwargs.items()), config.out_dtypes)
        if key not in self._functions:

            def roundtrip(x):
                q = lowp_jax.quantize(x, config.scheme, **kwargs)
                return q, tuple(lowp_jax.dequantize(q, d) for d in config.out_dtypes)

            self._functions[key] = jax.jit(roundtrip)
        return self._functions[key]


def _byte_array(t) -> np.ndarray:
    """A torch tensor's bytes as a NumPy uint8 array (last dim times the item size)."""
    import torch

    return t.detach().cpu().contiguous().view(torch.uint8).numpy()


def _int_view(x: np.ndarray) -> np.ndarray:
    """A copy of x's bits as signed integers, which torch.from_numpy takes for every
    input dtype (it has no ml_dtypes.bfloat16); a view back keeps the bits exactly."""
    return np.array(x, order="C").view({2: np.int16, 4: np.int32}[x.dtype.itemsize])


def _torch_to_numpy(t) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


BACKENDS = (
    NumpyBackend(),
    TorchBackend("torch_cpu", "cpu", compiled=False),
    TorchBackend("torch_cuda_eager", "cuda", compiled=False),
    TorchBackend("torch_cuda_compiled", "cuda", compiled=True),
    JaxBackend("jax_cpu", "cpu"),
    JaxBackend("jax_gpu", "gpu"),
)


def get(name: str):
    """The backend called `name`; ValueError naming it if there is none."""
    for backend in BACKENDS:
        if backend.name == name:
            return backend
    raise ValueError(f"unknown conformance backend {name!r}; expected one of {NAMES}")


def present() -> list:
    """The backends this machine can run, in NAMES order."""
    return [b for b in BACKENDS if b.problem() is None]
