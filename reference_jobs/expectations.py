"""What each bundled recording under traces/ must and must not show, derived from the scenario tables
(no committed copy: a rule added to the registry is judged on every recording the day it is added).

    expectations(traces)  ->  {folder: {"scenario", "must", "must_not"[, "hang", "injects"]}}

for every folder of ``traces`` that holds a recording named here: the reference scenarios
(scenarios.SCENARIOS, traces/<name>/), the scaling runs, the GRU cycle runs, the recorded hangs
(hang_scenarios.py), the H100 recordings (traces/cuda/<name>/) and the built gloo-on-CUDA trace.
No torch import (the tests and scorecard.py read it)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdpdoctor.diagnose.rules import RULE_IDS  # noqa: E402
from hang_scenarios import HANG_SCENARIOS  # noqa: E402
from hang_scenarios import expected as hang_expected  # noqa: E402
from scenarios import RULES, SCALING_RUNS, SCENARIOS, expected  # noqa: E402

# reference_jobs/gru_cycles.py (two profiler cycles, through capture and through the trace handler):
# the slow loader it injects; judged on the same rules as train.py's scenarios
GRU_RUNS = {"gru_cycles": ["input-bound"], "gru_cycles_handler": ["input-bound"]}

# traces/cuda/<name>: train.py's scenario on one H100 (world size 1, NCCL). One rank has no cross-rank
# collective to judge, and prefetch cannot be observed at world size 1 (fsdp2_no_backward_prefetch
# shows nothing); the tiny model leaves the GPU idle and the wrapper runs at world size 1 in every one.
CUDA_NOT_JUDGED = {"exposed-comm-high", "low-overlap", "latency-bound-collectives", "low-bus-bandwidth"}
CUDA_ALWAYS = ["gpu-idle", "wrapper-world-size-1"]
CUDA_MUST = {"dataloader_slow": ["input-bound"], "ddp_default": [], "fsdp2_default": [],
             "fsdp2_no_backward_prefetch": [], "host_sync": ["host-sync"]}

# traces/cuda_gloo_sleeper: built from cuda/ddp_default by reference_jobs/gloo_cuda_trace.py (gloo for
# CUDA tensors, rank 1 sleeping): judged on what the build changes and what it must not invent
GLOO_SLEEPER = {"must": ["straggler", "cpu-staged-collectives"],
                "must_not": ["input-bound", "host-sync", "offload-exposed", "ranks-never-communicate",
                             "mixed-backends"]}


def _judged(must: list[str], universe: list[str]) -> dict:
    return {"must": list(must), "must_not": [r for r in universe if r not in must]}


def expectations(traces: Path) -> dict[Path, dict]:
    """Every recording under ``traces`` that a table here names, with its expectations."""
    out: dict[Path, dict] = {}
    for name in SCENARIOS:
        out[traces / name] = expected(name)
    for name, (scenario, _nproc) in SCALING_RUNS.items():
        out[traces / name] = {**expected(scenario), "scenario": name}
    for name, must in GRU_RUNS.items():
        out[traces / name] = {"scenario": name, **_judged(must, RULES)}
    for name in HANG_SCENARIOS:
        out[traces / name] = hang_expected(name)
    cuda_rules = [r for r in RULE_IDS if r not in CUDA_NOT_JUDGED]
    for name, must in CUDA_MUST.items():
        out[traces / "cuda" / name] = {"scenario": name, **_judged(must + CUDA_ALWAYS, cuda_rules)}
    out[traces / "cuda_gloo_sleeper"] = {"scenario": "cuda_gloo_sleeper", **GLOO_SLEEPER}
    return {folder: exp for folder, exp in out.items() if folder.is_dir()}
