"""The `lowp_torch` logger, and messages given once per distinct cause.

Nothing is logged while torch.compile traces (`torch.compiler.is_compiling()`): a log
call inside a traced region would cost a graph break. The decisions logged here are
made from static shapes, dtypes and devices, so one eager call shows what a compiled
model does, with one exception: the small-shape policy judges a traced call by its
device time alone (`lowp._small_shapes`), so a compiled step may quantize a call whose
eager twin logged that it runs in high precision.
"""

import logging
from collections.abc import Callable, Hashable

import torch

logger = logging.getLogger("lowp_torch")
_said: set[tuple[int, Hashable]] = set()


def debug(message: str | Callable[[], str]) -> None:
    """Log `message` at DEBUG. Pass a callable where building the text takes more than
    an f-string of constants: it is built only where it is logged, and Dynamo cannot
    trace some str methods (`str.join`) inside an autograd.Function's forward."""
    if not torch.compiler.is_compiling() and logger.isEnabledFor(logging.DEBUG):
        logger.debug(message() if callable(message) else message)


def warn_once(key: str, message: str) -> None:
    """Log `message` at WARNING the first time `key` is seen in this process."""
    _once(logging.WARNING, key, message)


def info_once(key: Hashable, message: str | Callable[[], str]) -> None:
    """Log `message` at INFO the first time `key` is seen in this process. A callable
    message is built only then: a layer's forward that asks on every call pays for a
    set lookup, not for formatting text it will not log."""
    _once(logging.INFO, key, message)


def _once(level: int, key: Hashable, message: str | Callable[[], str]) -> None:
    if torch.compiler.is_compiling() or (level, key) in _said:
        return
    _said.add((level, key))
    logger.log(level, message() if callable(message) else message)
