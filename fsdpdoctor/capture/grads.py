"""Which parameters received a gradient in each profiled step (the evidence find_unused_parameters needs).

DDP's ``find_unused_parameters=True`` is unneeded only when every parameter gets a gradient in every
step; a parameter that never does (an auxiliary head left out of the loss) makes ``False`` crash DDP
("Expected to have finished reduction in the prior iteration"). The trace shows counts of gradient
accumulations, not which parameter got one, so the capture records it per parameter: a
post-accumulate-grad hook on each trainable parameter of a DDP model marks it when it holds a gradient
(DDP runs the hook of an unused parameter too, with no gradient), and each profiled step ends by noting
the parameters left unmarked. A parameter that once had a gradient and is zeroed in place
(zero_grad(set_to_none=False)) keeps a tensor of zeros and would look present in a later step. Only DDP models get the hooks (the question is DDP's).
"""

from __future__ import annotations

MAX_NAMES = 20   # names listed in the manifest; the count is always complete


class GradPresence:
    def __init__(self, model):
        self.names: list[str] = []
        self.steps = 0
        self.missed: dict[int, int] = {}   # parameter index -> profiled steps without a gradient
        self._seen: set[int] = set()
        self._handles = []
        for i, (name, p) in enumerate((n, p) for n, p in model.named_parameters() if p.requires_grad):
            self.names.append(name)
            self._handles.append(p.register_post_accumulate_grad_hook(lambda q, i=i: self._mark(q, i)))

    def _mark(self, p, i: int) -> None:
        # DDP with find_unused_parameters=True runs the hook of an unused parameter too, its grad left None
        if p.grad is not None:
            self._seen.add(i)

    @classmethod
    def of(cls, model) -> GradPresence | None:
        """Hooks on a DDP model's parameters; None for anything else or where hooks cannot be set."""
        if model is None or not hasattr(model, "find_unused_parameters"):
            return None
        try:
            return cls(model)
        except Exception:  # an older torch without post-accumulate hooks: the manifest says nothing
            return None

    def end_step(self, profiled: bool) -> None:
        if profiled:
            self.steps += 1
            for i in range(len(self.names)):
                if i not in self._seen:
                    self.missed[i] = self.missed.get(i, 0) + 1
        self._seen.clear()

    def describe(self, rank: int) -> dict:
        """For the manifest: on this rank, over the profiled steps, the parameters that missed a gradient."""
        missed = sorted(self.missed.items(), key=lambda kv: -kv[1])
        return {"rank": rank, "steps": self.steps, "parameters": len(self.names),
                "without_grad": len(missed),
                "names": {self.names[i]: n for i, n in missed[:MAX_NAMES]}}
