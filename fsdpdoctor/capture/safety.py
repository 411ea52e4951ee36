"""What keeps the capture from hurting the job it watches: a failure is one warning, a Ctrl-C that
lands while a trace is written is held until the file is whole, and a warning the profiler alone
causes is silenced while it runs."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import warnings


def _warn(msg: str) -> None:
    warnings.warn(f"fsdpdoctor.capture: {msg}", RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def _sigint_held():
    """Hold Ctrl-C while a trace is written: torchrun delivers a second SIGINT to the ranks, which
    would land inside the export and leave no trace. Yields the list of signals held (main thread only)."""
    held: list[int] = []
    old = None
    if threading.current_thread() is threading.main_thread():
        try:
            old = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
        except (ValueError, OSError, TypeError):
            old = None
    try:
        yield held
    finally:
        if old is not None:
            try:
                signal.signal(signal.SIGINT, old)
            except (ValueError, OSError, TypeError):
                pass


_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _drop_own_frames(tb) -> None:
    """Cut a Ctrl-C's traceback where it enters the capture's bookkeeping: the interrupt is the user's,
    held or landed while the capture noted the step, and its traceback ends at the job's own line
    (``cap.step()``) instead of running through the capture's files. The decorator's wrapper is never
    cut (the job's code runs inside it)."""
    prev = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if prev is not None and code.co_filename.startswith(_OWN_DIR) and code.co_name != "wrapper":
            prev.tb_next = None
            return
        prev, tb = tb, tb.tb_next


# With with_stack=True, torch.profiler's Python tracer reads ``.grad`` of the parameters
# of every module it sees called. FSDP1 with use_orig_params=True keeps the original
# parameters as views of its flat parameter (non-leaf tensors), so that read makes torch
# warn "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed" once
# per rank: a warning the job does not give without the capture. It is silenced, for
# exactly that message, only while this capture's profiler runs.
_TRACER_GRAD_WARNING = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"


def _silence_tracer_grad_warning() -> tuple:
    warnings.filterwarnings("ignore", message=_TRACER_GRAD_WARNING, category=UserWarning)
    return warnings.filters[0]


def _restore_warning_filter(entry) -> None:
    try:
        warnings.filters.remove(entry)
        warnings._filters_mutated()  # type: ignore[attr-defined]  # invalidate the once-per-location cache
    except (ValueError, AttributeError):
        pass
