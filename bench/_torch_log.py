"""What lowp_torch decided during one eager call, read from its debug log.

lowp_torch logs each GEMM's kernel ("kernel='scaled_mm'") and each cast's path
(Triton kernels or torch ops) at debug level. Under torch.compile nothing is logged,
but the choices are static (shapes, dtypes, device), so one eager call tells what
the compiled one runs too. A bench row carries this so that a number measured on an
emulated GEMM or a slow cast path says so itself.
"""

import logging
import re


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def lowp_decisions(call) -> dict:
    """Run `call()` once with lowp_torch's debug log captured.

    Returns {"gemms": [kernel per quantized GEMM, in call order], "casts": {"triton": n,
    "torch": n}}; a high-precision GEMM (a `_gw_hp` recipe's wgrad) logs nothing.
    """
    logger = logging.getLogger("lowp_torch")
    handler, level = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        call()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    gemms, casts = [], {"triton": 0, "torch": 0}
    for message in handler.messages:
        found = re.search(r"kernel='(\w+)'", message)
        if found:
            gemms.append(found.group(1))
        elif "on the Triton kernels" in message:
            casts["triton"] += 1
        elif "quantize on torch ops" in message:
            casts["torch"] += 1
    return {"gemms": gemms, "casts": casts}
