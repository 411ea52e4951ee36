"""Which training framework runs the loop, so that a fix is written in its terms (diagnose/settings.py):
the manifest's ``framework`` where a callback recorded it, else the Python frames of the trace (the
framework's own training loop on the stack), else plain PyTorch, with what said so."""

from __future__ import annotations

from fsdpdoctor.trace.table import PYFUNC

FRAMEWORKS = ("plain", "hf-trainer", "lightning", "accelerate")
# frames that only the framework's own loop runs, by framework, the most specific first: the HF Trainer
# runs on Accelerate, and a Qwen model in a plain loop runs transformers/models/... but never trainer.py
_MARKERS = (("hf-trainer", ("transformers/trainer.py",)),
            ("lightning", ("lightning/pytorch/", "pytorch_lightning/")),
            ("accelerate", ("accelerate/accelerator.py",)))


def framework_frames(t) -> list[str]:
    """The frameworks whose loop frames this rank's trace holds (empty without Python stacks)."""
    if not t.has_stacks:
        return []
    names = t.names
    seen = [names[i] for i in t.ids_in_categories(PYFUNC).tolist()]
    return [fw for fw, prefixes in _MARKERS if any(n.startswith(prefixes) for n in seen)]


def job_framework(manifest: dict | None, frames: set[str], has_stacks: bool) -> tuple[str, str]:
    """(framework, what said so)."""
    recorded = ((manifest or {}).get("framework") or {}).get("name")
    if recorded in FRAMEWORKS:
        return recorded, "manifest"
    for fw, prefixes in _MARKERS:
        if fw in frames:
            return fw, f"trace frames ({prefixes[0]})"
    if has_stacks:
        return "plain", "trace frames (no framework's training loop on the stack)"
    return "plain", "assumed: no Python stacks in the trace and no framework in the manifest"
