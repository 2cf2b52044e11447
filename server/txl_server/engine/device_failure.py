"""Whether an error is the device's own, and whether the device survived it.

CUDA errors come in two kinds. A sticky one (an illegal address, a launch failure, an ECC error) poisons the
context: every later call fails, and only a new process serves again. Another (cuBLAS refusing a configuration,
`CUBLAS_STATUS_NOT_SUPPORTED`; a launch configuration the device refuses; an operation a capture does not allow)
fails the call that raised it, and the device runs on. Both read "CUDA error: ...", so the text alone cannot tell
them apart: the device is asked (`device_works`: a tiny computation, read back). Start-up (`engine.selfcheck`)
and serving (`engine.worker`) decide alike: the device has failed when it raised an error of its own and then
no longer works. A device marked failed fails liveness, and the watchdog restarts the process, dropping the
sessions it held in memory: worth a probe, on an error that is rare.
"""

from __future__ import annotations

import torch


def is_device_error(exc: BaseException) -> bool:
    """An error of the accelerator itself (an illegal address, a launch failure, ECC; or one it runs on after),
    not an error of the request."""
    return isinstance(exc, torch.AcceleratorError) or (
        isinstance(exc, RuntimeError) and str(exc).startswith(("CUDA error", "CUDA driver error"))
    )


def device_works(device: torch.device) -> bool:
    """Whether the device still runs work: after a sticky error (an illegal address) every later call fails;
    after another (an operation a capture does not allow) it runs on, and only the piece that raised is off."""
    try:
        probe = torch.ones(2, device=device).sum()
        return float(probe) == 2.0  # the host read waits for the device
    except Exception:
        return False


def device_failed(exc: BaseException, device: torch.device) -> bool:
    """Whether `exc` leaves `device` unable to serve: an error of the device, after which it no longer works."""
    return is_device_error(exc) and not device_works(device)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none): for logs and reports."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
