"""What the machine's accelerators are, for the choices made when lowering."""

import functools

import jax


def cuda_capability(device) -> tuple[int, ...] | None:
    """(major, minor) of a CUDA device, None for any other (CPU, ROCm, TPU)."""
    if device.platform != "gpu":
        return None
    if "rocm" in str(getattr(device.client, "platform_version", "")).lower():
        return None
    try:
        return tuple(int(p) for p in str(device.compute_capability).split("."))
    except (AttributeError, ValueError):
        return None


@functools.cache
def sm90_gpus() -> bool:
    """JAX has CUDA devices, and every one is of compute capability >= 9.0 (a kernel
    chosen when lowering for CUDA may run on any of them)."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:  # no GPU backend
        return False
    return bool(devices) and all((cuda_capability(d) or (0,)) >= (9, 0) for d in devices)
