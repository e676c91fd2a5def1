"""cast_kernels across threads (issue 23 item 3): a thread's own block wins in that thread,
and a thread without one (the autograd engine's device thread) sees the open blocks' mode."""

import threading

import pytest
import torch

import lowp
import lowp_torch
from lowp_torch import _cast_kernels


def _in_threads(*targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)


def test_a_threads_own_block_wins_over_a_later_block_of_another_thread():
    """B opens "torch", then A opens "triton" and holds it: B's CPU quantize stays on torch
    ops (it raised "cast_kernels('triton') cannot run: the input is on cpu" before)."""
    b_open, a_open, b_done = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def thread_a():
        b_open.wait(10)
        with lowp_torch.cast_kernels("triton"):
            a_open.set()
            b_done.wait(10)

    def thread_b():
        with lowp_torch.cast_kernels("torch"):
            b_open.set()
            a_open.wait(10)
            try:
                q = lowp_torch.quantize(torch.ones(64), lowp.MXScaling(), name="b")
                seen["b codes"] = q.codes.view(torch.uint8).tolist()
            except ValueError as e:
                seen["b codes"] = str(e)
            finally:
                b_done.set()

    _in_threads(thread_a, thread_b)
    expected = lowp.quantize(torch.ones(64).numpy(), lowp.MXScaling()).codes.tolist()
    assert seen["b codes"] == expected


def test_a_thread_without_a_block_sees_the_latest_open_one():
    """The autograd engine's device thread opens no block: it must see the mode of the
    block the forward ran in (the reason the mode is not a context variable); a thread
    with a block of its own sees its own."""
    seen = []

    def mode_here():
        x = torch.ones(64, requires_grad=True)
        seen.append(_cast_kernels.current_mode())
        x.sum().backward()  # a thread of its own may run autograd too

    def own_block():
        with lowp_torch.cast_kernels("auto"):
            mode_here()

    # One thread at a time: while a thread holds a block, that block is the latest open
    # one, and a thread without a block running beside it would see it (the rule above).
    with lowp_torch.cast_kernels("torch"):
        _in_threads(mode_here)
        with lowp_torch.cast_kernels("triton"):
            _in_threads(mode_here)
            _in_threads(own_block)
        _in_threads(mode_here)
    _in_threads(mode_here)
    assert seen == ["torch", "triton", "auto", "torch", "auto"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the device thread needs CUDA")
def test_a_cuda_backward_quantizes_in_the_forwards_mode(monkeypatch):
    """On CUDA the backward's casts run in autograd's device thread, which opens no block:
    under "torch" every cast, forward and backward, stays on torch ops.

    small_shapes="quantize": on a GPU whose fp8 GEMMs run (sm_89+), the default policy
    runs a 256x256x256 call as the float layer does, with no cast at all to record (what
    failed on the H200: the recorder had nothing, in any thread)."""
    calls = []
    use_triton = _cast_kernels.use_triton

    def recording(*args, **kwargs):
        took = use_triton(*args, **kwargs)
        calls.append((threading.get_ident(), _cast_kernels.current_mode(), took))
        return took

    monkeypatch.setattr(_cast_kernels, "use_triton", recording)
    layer = lowp_torch.Linear(
        256, 256, recipe="float8_rowwise", device="cuda", small_shapes="quantize"
    )
    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    with lowp_torch.cast_kernels("torch"):
        y = layer(x)
        here = threading.get_ident()
        assert calls and all(thread == here for thread, _, _ in calls), "no forward cast"
        forward = len(calls)
        y.sum().backward()
    backward = calls[forward:]
    assert backward, "no cast was recorded in the backward"
    assert all(thread != here for thread, _, _ in backward), "a backward cast ran in this thread"
    assert all(mode == "torch" and not took for _, mode, took in calls), calls
