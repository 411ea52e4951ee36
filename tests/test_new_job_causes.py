"""Causes that must hold on jobs the rules were not written for (reference jobs recorded for them):
loader workers started again at every epoch, periodic work seen twice in the profiled window, periodic
work every rank does, and no straggler without an imbalance beyond the run's noise."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdpdoctor.diagnose.facts import imbalance_beyond_noise
from fsdpdoctor.diagnose.thresholds import resolve
from fsdpdoctor.pipeline import open_analysis

TRACES = Path(__file__).resolve().parents[1] / "traces"


def _analysis(name: str):
    return open_analysis(TRACES / name, use_summaries=False)


def _ids(a) -> set[str]:
    return {f.id for f in a.findings}


def test_loader_workers_started_at_every_epoch_are_a_data_loading_cause():
    """loader_epoch_restart (epochs of 4 batches, 2 workers, persistent_workers=False): both ranks wait at every
    epoch start. The cause is the loader starting its workers again, named with persistent_workers=True, not
    one rank's periodic stall in the model's forward; the same job with persistent_workers=True starts none
    inside the window and gets no loader finding."""
    a = _analysis("loader_epoch_restart")
    for d in a.signals.dataloader:
        assert d.iterator == "_MultiProcessingDataLoaderIter"
        assert d.worker_start_steps == [4, 8] and len(d.worker_start_each_us) == 2 and d.worker_start_us > 0
    assert "periodic-stall" not in _ids(a) and "straggler" not in _ids(a)
    f = next(f for f in a.findings if f.id == "input-bound")
    assert f.title.startswith("DataLoader workers start again at every epoch") and "every 4 steps" in f.title
    assert "persistent_workers=True" in f.fix and "forward" not in f.fix
    # the fix as data: the generic setting, written in the job's framework (plain PyTorch here)
    (setting,) = f.settings
    assert (setting.name, setting.value, setting.now, setting.where) == ("loader.persistent_workers", True, False,
                                                                         "DataLoader")
    assert f.severity in ("warning", "error") and sorted(f.ranks) == [0, 1]
    # the saving is the starts' own time spread over the epoch, not more than the stall the steps show
    assert f.impact_us == pytest.approx(sum(d.worker_start_us for d in a.signals.dataloader) / 2 / 4)
    healthy = _analysis("loader_epoch_persistent")
    assert all(not d.worker_start_steps for d in healthy.signals.dataloader)
    assert not {"input-bound", "periodic-stall", "straggler"} & _ids(healthy)


def test_loader_restarts_without_stacks_are_inferred_from_the_loaders_periodic_wait(tmp_path):
    """The same recording without Python stacks (its python_function events removed): the new iterator is not
    seen, but every rank's worker-process loader waits in the periodic steps: still the loader's cause, said to
    be inferred, and still no periodic stall in the forward."""
    import gzip
    import json
    import shutil

    run = tmp_path / "nostack"
    shutil.copytree(TRACES / "loader_epoch_restart", run)
    for f in run.glob("rank*.json.gz"):
        d = json.loads(gzip.open(f).read())
        d["traceEvents"] = [e for e in d["traceEvents"] if e.get("cat") != "python_function"]
        with gzip.open(f, "wt", compresslevel=1) as fh:
            fh.write(json.dumps(d))
    m = json.loads((run / "manifest.json").read_text())
    m["options"]["with_stack"] = False
    (run / "manifest.json").write_text(json.dumps(m))
    a = open_analysis(run, use_summaries=False)
    assert not a.job.has_stacks and all(not d.worker_start_steps for d in a.signals.dataloader)
    assert "periodic-stall" not in _ids(a)
    f = next(f for f in a.findings if f.id == "input-bound")
    assert f.title.startswith("DataLoader workers start again at every epoch") and "persistent_workers=True" in f.fix
    assert "Inferred" in f.summary and any("no Python stacks" in e.text for e in f.evidence)


def test_periodic_work_seen_twice_in_the_window_is_found():
    """periodic_checkpoint_short: the run is the profiled window (8 steps), rank 0 saving a checkpoint after every
    4th: two occurrences only, corroborated by the frame that runs in those two steps alone (save_checkpoint)."""
    a = _analysis("periodic_checkpoint_short")
    p = a.periodic
    assert p is not None and p.source == "profiled steps" and p.period == 4 and p.stalled_steps == [3, 7]
    assert p.rank == 0 and not p.every_rank and p.frame.endswith(": save_checkpoint")
    f = next(f for f in a.findings if f.id == "periodic-stall")
    assert f.title == "Rank 0 stalls every 4th step (save_checkpoint)" and f.ranks == [0]
    assert "async_save" in f.fix


def test_periodic_work_of_every_rank_is_named_as_such():
    """periodic_eval_all_ranks: every rank evaluates its share after every 3rd step. Named as every rank's periodic
    work (each rank's own time rises in those steps), not as one rank's stall, with a fix that does not tell it to
    spread the evaluation over the ranks it already runs on; rank 0's evaluation alone (periodic_eval) stays one
    rank's."""
    a = _analysis("periodic_eval_all_ranks")
    p = a.periodic
    assert p is not None and p.every_rank and p.period == 3 and p.ranks_showing == [0, 1]
    f = next(f for f in a.findings if f.id == "periodic-stall")
    assert f.title.startswith("Every rank pauses every 3rd step") and f.ranks == [0, 1]
    assert "none waits for another" in f.summary and "evaluate less often" in f.fix
    assert "evaluate on every rank" not in f.fix
    one = _analysis("periodic_eval")
    assert not one.periodic.every_rank
    g = next(f for f in one.findings if f.id == "periodic-stall")
    assert g.title.startswith("Rank 0 stalls") and g.ranks == [0]


@pytest.mark.parametrize("name", ["hf_dataloader_slow", "ddp_find_unused", "mixer_lightning", "moe_balanced"])
def test_no_imbalance_beyond_noise_on_runs_without_one(name):
    """Runs whose ranks do the same work (a loader stall on both, healthy runs): the rank last most often is not
    behind by an imbalance beyond the run's noise (its per-step excess goes both ways, or stays under the step
    noise), so no straggler can be made of it."""
    a = _analysis(name)
    s = a.straggler
    assert s is not None and s.extra_each_us
    assert not imbalance_beyond_noise(s, resolve(None)["straggler_noise_z"])
    assert "straggler" not in _ids(a)


@pytest.mark.parametrize("name", ["straggler", "hf_straggler_sleep", "seq_length_skew", "moe_routing_skew",
                                  "wrap_fsdp1_no_prefetch_slow_collate"])
def test_an_injected_imbalance_is_beyond_noise(name):
    """The injected stragglers (a sleep, longer sequences, more routed tokens, a slow collate) are behind in every
    step by a like amount: beyond the noise, and found."""
    a = _analysis(name)
    assert imbalance_beyond_noise(a.straggler, resolve(None)["straggler_noise_z"])
    assert "straggler" in _ids(a)
