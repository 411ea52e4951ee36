"""Capture torch.profiler traces of a DDP/FSDP training job into a run folder.

This is the only part of fsdpdoctor that imports torch, and it does so lazily
(inside functions), so ``import fsdpdoctor.capture`` works without torch.

Usage::

    from fsdpdoctor.capture import capture

    with capture("runs/r1", model=model, optimizer=opt, tokens_per_step=4096) as cap:
        for batch in loader:
            train_step(batch)
            cap.step()

    # or as a decorator: every call of the function is one step
    @capture("runs/r1", model=model)
    def train_step(batch): ...

Every rank also keeps its step series for the whole run (``steps/rank<N>.steps``), and windows of
profiled steps open later on demand (``fsdpdoctor trigger OUT``) or on a slowdown (``auto=True``) into
``OUT/window-<first step>/``: see ``docs/capture.md``. See ``docs/manifest.md`` for the folder layout
and the manifest schema.
"""

from fsdpdoctor.capture.core import Capture, capture, track_fsdp2_prefetch_calls
from fsdpdoctor.capture.manifest import describe_model, describe_wrapping
from fsdpdoctor.capture.watch import Watch, enable_flight_recorder, watch

__all__ = [
    "Capture",
    "capture",
    "describe_model",
    "describe_wrapping",
    "track_fsdp2_prefetch_calls",
    "Watch",
    "watch",
    "enable_flight_recorder",
]
