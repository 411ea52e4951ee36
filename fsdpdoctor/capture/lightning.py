"""PyTorch Lightning integration: one callback wraps ``Trainer.fit`` in :func:`fsdpdoctor.capture.capture`.

    from fsdpdoctor.capture.lightning import FsdpdoctorCallback

    trainer = L.Trainer(strategy="ddp", callbacks=[FsdpdoctorCallback("runs/r1")])

The capture starts when training starts (the strategy has set up the process group and wrapped the
model), marks a step at every optimizer step (``trainer.global_step`` advances: gradient accumulation's
micro-batches are one step) and closes when training ends or fails. The manifest is filled from the
strategy: its wrapped model (``DistributedDataParallel``, FSDP...), the first optimizer, and the samples of
one optimizer step over all ranks. Lightning is an optional dependency: this module imports it only here.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:  # pragma: no cover - without lightning
        raise ImportError("fsdpdoctor.capture.lightning needs PyTorch Lightning: pip install lightning") from exc

from fsdpdoctor.capture.core import capture
from fsdpdoctor.capture.host import framework_record

__all__ = ["FsdpdoctorCallback"]


def _batch_size(trainer) -> int | None:
    loader = getattr(trainer, "train_dataloader", None)
    bs = getattr(loader, "batch_size", None)
    return bs if isinstance(bs, int) and bs > 0 else None


class FsdpdoctorCallback(Callback):
    """Capture the fit loop into ``out_dir``; keyword arguments go to :func:`~fsdpdoctor.capture.capture`
    (``wait``, ``warmup``, ``active``, ``tokens_per_step``, ``auto``...). ``samples_per_step`` defaults to
    the train loader's batch size x world size x ``accumulate_grad_batches``."""

    def __init__(self, out_dir, **capture_kwargs: Any):
        super().__init__()
        self.out_dir = out_dir
        self.capture_kwargs = capture_kwargs
        self.cap = None
        self._last_step = 0

    def on_train_start(self, trainer, pl_module) -> None:
        kw = dict(self.capture_kwargs)
        if "samples_per_step" not in kw:
            bs = _batch_size(trainer)
            if bs is not None:
                kw["samples_per_step"] = bs * trainer.world_size * max(int(trainer.accumulate_grad_batches), 1)
        optimizers = list(getattr(trainer, "optimizers", None) or [])
        # the strategy's model is the wrapped one (DDP/FSDP around the LightningModule)
        model = getattr(trainer.strategy, "model", None) or pl_module
        self.cap = capture(self.out_dir, model=model, optimizer=optimizers[0] if optimizers else None, **kw)
        self.cap.framework = framework_record("lightning", "lightning", "pytorch-lightning")
        self.cap.start()
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # one capture step per optimizer step (micro-batches of gradient accumulation leave global_step)
        if self.cap is not None and trainer.global_step != self._last_step:
            self._last_step = trainer.global_step
            self.cap.step()

    def _close(self) -> None:
        if self.cap is not None:
            cap, self.cap = self.cap, None
            cap.close()

    def on_train_end(self, trainer, pl_module) -> None:
        self._close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close()

    def teardown(self, trainer, pl_module, stage) -> None:
        self._close()
