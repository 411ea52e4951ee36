"""Hugging Face integration: a ``TrainerCallback`` wraps ``Trainer.train`` in
:func:`fsdpdoctor.capture.capture`.

    from fsdpdoctor.capture.hf import FsdpdoctorCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds)
    trainer.add_callback(FsdpdoctorCallback("runs/r1", trainer=trainer))

The capture starts at ``on_train_begin`` (Accelerate has set up the process group and prepared the
model), marks a step at every optimizer step (``on_step_end``: after gradient accumulation) and closes at
``on_train_end``. The manifest is filled from the Trainer's strategy: its wrapped model
(``trainer.model_wrapped``: DDP or FSDP as Accelerate prepared it), the optimizer, and the samples of one
optimizer step over all ranks. Without ``trainer=`` (``Trainer(..., callbacks=[FsdpdoctorCallback("runs/r1")])``)
the callback finds the Trainer that calls it on the call stack; where it cannot, it says so on stderr and in
the manifest's ``warnings`` instead of recording the unwrapped model as ``wrapping: none``. With Accelerate alone (no Trainer), wrap the loop in ``capture()`` with the
prepared model: ``capture(out, model=accelerator.prepare(model), ...)`` (docs/frameworks.md).
transformers is an optional dependency: this module imports it only here.
"""

from __future__ import annotations

import sys
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - without transformers
    raise ImportError("fsdpdoctor.capture.hf needs transformers: pip install transformers accelerate") from exc

from fsdpdoctor.capture.core import capture
from fsdpdoctor.capture.host import framework_record
from fsdpdoctor.capture.safety import _warn

__all__ = ["FsdpdoctorCallback"]


class FsdpdoctorCallback(TrainerCallback):
    """Capture the training loop into ``out_dir``; keyword arguments go to
    :func:`~fsdpdoctor.capture.capture`. ``samples_per_step`` defaults to per-device batch size x world size x
    gradient accumulation steps."""

    def __init__(self, out_dir, trainer=None, **capture_kwargs: Any):
        self.out_dir = out_dir
        self.trainer = trainer
        self.capture_kwargs = capture_kwargs
        self.cap = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        kw = dict(self.capture_kwargs)
        if "samples_per_step" not in kw:
            kw["samples_per_step"] = (int(args.per_device_train_batch_size) * max(int(args.world_size), 1)
                                      * max(int(args.gradient_accumulation_steps), 1))
        trainer = self.trainer if self.trainer is not None else _calling_trainer()
        wrapped = getattr(trainer, "model_wrapped", None) if trainer is not None else None
        opt = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
        self.cap = capture(self.out_dir, model=wrapped if wrapped is not None else model, optimizer=opt, **kw)
        self.cap.framework = framework_record("hf-trainer", "transformers", "accelerate")
        if trainer is None and int(args.world_size) > 1:
            text = ("FsdpdoctorCallback found no Trainer calling it, so it records the unwrapped model: pass "
                    "trainer=trainer for the DDP/FSDP wrapper")
            _warn(text)
            self.cap.warnings.append(text)
        self.cap.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.cap is not None:
            self.cap.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.cap is not None:
            cap, self.cap = self.cap, None
            cap.close()


def _calling_trainer():
    """The ``transformers.Trainer`` whose training loop calls this callback (the ``self`` of a frame up the
    stack: ``Trainer._inner_training_loop`` -> ``CallbackHandler.on_train_begin`` -> here), or None."""
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        obj = frame.f_locals.get("self")
        if isinstance(obj, Trainer):
            return obj
        frame = frame.f_back
    return None
