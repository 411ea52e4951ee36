"""The registry: every rule module, listed here, and the one call that runs them.

A rule module holds functions declared with ``@rule(ids=..., thresholds=...)`` (framework.py); every
``Rule`` a listed module defines runs, in the order of this list and of definition. Adding a rule is
one function in one of these modules (docs/adding-a-rule.md).

Root cause first: a finding lists in ``consequences`` the ids of findings it explains; ``diagnose``
folds those under it (``caused_by``), caps them at "info" so only the root gates ``check``, and keeps
them right after their root. Fixes name this job's configuration when the manifest gives it, and
never suggest what is already set.
"""

from __future__ import annotations

import re
from types import ModuleType

from fsdpdoctor.diagnose import (
    comm_rules, ddp_rules, gpu_rules, host_rules, metric_rules, periodic_rules, prefetch_rules, setup_rules,
    wrapping_rules,
)
from fsdpdoctor.diagnose.framework import Rule, run_rules
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.results import Analysis, Finding

RULE_MODULES: tuple[ModuleType, ...] = (prefetch_rules, comm_rules, ddp_rules, host_rules, setup_rules, gpu_rules,
                                         periodic_rules, wrapping_rules, metric_rules)


def rules_of(module: ModuleType) -> list[Rule]:
    """The rules a module defines (not those it imports from another: each rule runs once)."""
    return [v for v in vars(module).values() if isinstance(v, Rule) and v.fn.__module__ == module.__name__]


RULES: tuple[Rule, ...] = tuple(r for m in RULE_MODULES for r in rules_of(m))
# every id a rule may emit, in registry order (the scorecard, JUnit and the reference scenarios use it)
RULE_IDS: list[str] = list(dict.fromkeys(i for r in RULES for i in r.ids))


def diagnose(analysis: Analysis, thresholds: dict[str, float] | None = None) -> list[Finding]:
    table = resolve(thresholds)
    apply_thresholds(analysis, table)
    findings = run_rules(RULES, analysis, table)
    name_device(findings, analysis)
    # the per-rank flag in the JSON says what the finding says
    slow = {r for f in findings if f.id == "straggler" for r in f.ranks}
    for r in analysis.ranks:
        r.is_straggler = r.rank in slow
    return findings


_GPU = re.compile(r"\bGPU(s?)\b")
# advice that holds on CUDA (and on ROCm, which keeps torch.cuda, graph capture and RCCL behind NCCL's name)
# only: on another accelerator's input each is replaced by what applies there ({dev}: its torch module,
# {backend}: its collective backend), or dropped. A rule text that gains CUDA-only advice adds its line here.
CUDA_ONLY: tuple[tuple[re.Pattern, str], ...] = (
    # CUDA graphs: mode="reduce-overhead" captures CUDA graphs, no other backend's
    (re.compile(r', or CUDA graphs \(torch\.compile\(mode="reduce-overhead"\)\) to replay the step without '
                r"Python launch cost"), ""),
    (re.compile(r"torch\.cuda\.synchronize\(\)"), "torch.{dev}.synchronize()"),
    (re.compile(r"\(NCCL, "), "({backend}, "),
    (re.compile(r"Check NCCL_ALGO/NCCL_PROTO defaults, NIC/NVLink topology \(nvidia-smi topo -m\), and run "
                r"nccl-tests at this size"),
     "Check the settings of {backend} and the interconnect's topology, and run its own bandwidth test at this size"),
)


def name_device(findings: list[Finding], analysis: Analysis) -> None:
    """The rules' texts say "GPU"; on another accelerator's input (MTIA, XPU, NPU...) they name it instead,
    as the report header does (``InputKind.device_word``), and suggest only what applies to it
    (``CUDA_ONLY``: no CUDA graphs, no torch.cuda, no NCCL settings on MTIA)."""
    kind = analysis.job.input_kind if analysis.job is not None else None
    word = kind.device_word if kind is not None else "GPU"
    if word == "GPU":
        return
    backend = analysis.job.backend if analysis.job.backend not in (None, "", "undefined") else None
    fill = {"dev": word.lower(), "backend": backend or f"the {word}'s collective library"}

    def say(x: str) -> str:
        x = _GPU.sub(rf"{word}\1", x)
        for pat, repl in CUDA_ONLY:
            x = pat.sub(repl.format(**fill), x)
        return x

    for f in findings:
        f.title, f.summary, f.fix = say(f.title), say(f.summary), say(f.fix)
        for e in f.evidence:
            e.text = say(e.text)


def apply_thresholds(analysis: Analysis, table: dict[str, float]) -> None:
    """Figures of the analysis that depend on a threshold take it from the resolved table, so an
    override (``--threshold small_message_bytes=...``) reaches the tables as well as the rules."""
    if not analysis.collective_events:
        return  # a saved analysis keeps the counts it was written with
    small = table["small_message_bytes"]
    for st in analysis.collectives:
        st.small_messages = sum(1 for c in analysis.collective_events if c.kind == st.kind and c.phase == st.phase
                                and c.size_bytes and c.size_bytes < small)
