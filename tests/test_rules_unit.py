"""Every rule on a synthetic Analysis (tests/synthetic.py): it fires on the fault it declares and not
on a healthy run; the registry's declarations hold; folds happen only when the root's fix removes the
effect's time (each fold tested both ways); impacts are bounded by the step; an error needs
evidence over 2 steps or 2 ranks. The same rules run on recordings in test_diagnose, test_gpu_rules
and test_root_cause."""

from __future__ import annotations

from dataclasses import replace

import pytest

from synthetic import CPU, GPU, analysis, collectives, comm, ids, run, straggler_report
from fsdpdoctor.diagnose import comm_rules, ddp_rules, gpu_rules, host_rules, prefetch_rules, setup_rules
from fsdpdoctor.units import ms
from fsdpdoctor.diagnose.framework import RuleContext, RuleDefect, UndeclaredThreshold, rule, run_rules
from fsdpdoctor.diagnose.rules import RULE_IDS, RULES, diagnose
from fsdpdoctor.diagnose.thresholds import BY_NAME, resolve
from fsdpdoctor.results import (
    DataLoaderInfo, DdpInfo, Evidence, Finding, GpuIdle, HostSync, OffloadInfo, PrefetchStatus, RankSetup,
    RecomputeInfo, Signals,
)

MS = 1e3


def _fsdp1(backward="pre", forward="on") -> PrefetchStatus:
    return PrefetchStatus(framework="fsdp1", backward_mode=backward, forward_mode=forward, backward_all_gathers=8,
                          backward_prefetched=0 if backward == "none" else 8, forward_all_gathers=8)


def _fsdp2(backward="pre", prefetched=8) -> PrefetchStatus:
    return PrefetchStatus(framework="fsdp2", backward_mode=backward, forward_mode="n/a", backward_all_gathers=8,
                          backward_prefetched=prefetched, backward_on_demand=8 - prefetched)


def _gloo_setup(rank: int, kernels: int = 100, backend: str = "gloo") -> RankSetup:
    return RankSetup(rank=rank, world_size=2, backend=backend, pg_backends=[f"cuda:{backend}"], device_kernels=kernels,
                     gloo_spans=10 if backend == "gloo" else 0, collectives=10, collective_kinds=["all_reduce"],
                     has_backward=True, wrapper="ddp")


def _idle(cause: str, us: float, rank: int = 0) -> GpuIdle:
    by = {c: 0.0 for c in ("launch", "host_sync", "data_loading", "collective_wait", "host_compute", "profiler", "other")}
    by[cause] = us
    return GpuIdle(rank=rank, steps=[], idle_us=us, idle_frac=us / 100e3, by_cause=by, queue_empty_frac=0.9,
                   queue_delay_median_us=10.0)


# ------------------------------------------------------------------ each rule: fires on its fault, not on health
def test_fsdp1_backward_prefetch():
    ag = collectives(2, 4, "all_gather", "backward", per_step=4, exposed_us=2 * MS)
    off = run(prefetch_rules.fsdp1_backward_prefetch, analysis(wrapping="fsdp1", prefetch=_fsdp1("none"),
                                                                collective_events=ag))
    post = run(prefetch_rules.fsdp1_backward_prefetch, analysis(wrapping="fsdp1", prefetch=_fsdp1("post"),
                                                                 collective_events=ag))
    assert ids(off) == ["fsdp1-no-backward-prefetch"] and ids(post) == ["fsdp1-backward-post"]
    # gloo: every collective blocks the host on shared cores, a prefetch hides nothing (issue 28's pairs)
    assert off[0].impact_us == 0 and off[0].severity == "info" and "On a GPU" in off[0].summary
    gpu = run(prefetch_rules.fsdp1_backward_prefetch, analysis(traits=GPU, wrapping="fsdp1", prefetch=_fsdp1("none"),
                                                                collective_events=ag))
    # on its own stream: the exposed gathers, under the backward compute there is (2/3 of 100 ms)
    assert gpu[0].impact_us == pytest.approx(8 * MS) and gpu[0].severity == "warning"  # floor: a wrong setting
    assert run(prefetch_rules.fsdp1_backward_prefetch, analysis(wrapping="fsdp1", prefetch=_fsdp1("pre"),
                                                                 collective_events=ag)) == []


def test_forward_prefetch_off():
    ag = collectives(2, 4, "all_gather", "forward", per_step=4, exposed_us=1 * MS)
    found = run(prefetch_rules.forward_prefetch, analysis(wrapping="fsdp1", prefetch=_fsdp1(forward="off"),
                                                          collective_events=ag))
    assert ids(found) == ["fsdp-forward-prefetch-off"] and found[0].impact_us == 0
    gpu = run(prefetch_rules.forward_prefetch, analysis(traits=GPU, wrapping="fsdp1", prefetch=_fsdp1(forward="off"),
                                                        collective_events=ag))
    assert gpu[0].impact_us == pytest.approx(4 * MS)
    assert run(prefetch_rules.forward_prefetch, analysis(wrapping="fsdp1", prefetch=_fsdp1(forward="on"),
                                                         collective_events=ag)) == []
    # below forward_exposed_frac of the step: within the noise
    small = collectives(2, 4, "all_gather", "forward", per_step=1, exposed_us=0.5 * MS)
    assert run(prefetch_rules.forward_prefetch, analysis(wrapping="fsdp1", prefetch=_fsdp1(forward="off"),
                                                         collective_events=small)) == []


def test_fsdp2_backward_prefetch_ineffective():
    assert ids(run(prefetch_rules.fsdp2_backward_prefetch, analysis(wrapping="fsdp2", prefetch=_fsdp2(
        "none", prefetched=0)))) == ["fsdp2-backward-prefetch-ineffective"]
    assert run(prefetch_rules.fsdp2_backward_prefetch, analysis(wrapping="fsdp2", prefetch=_fsdp2("pre"))) == []


def test_fsdp2_explicit_prefetch_noop():
    empty = {"backward_prefetch": {"layers.0": [], "layers.1": []}}
    assert ids(run(prefetch_rules.fsdp2_explicit_noop, analysis(
        wrapping="fsdp2", wrapping_source="manifest", wrapping_details=empty,
        prefetch=_fsdp2("pre")))) == ["fsdp2-explicit-prefetch-noop"]
    listed = {"backward_prefetch": {"layers.1": ["layers.0"]}}
    assert run(prefetch_rules.fsdp2_explicit_noop, analysis(
        wrapping="fsdp2", wrapping_source="manifest", wrapping_details=listed, prefetch=_fsdp2("pre"))) == []


def test_exposed_comm():
    cpu = run(comm_rules.exposed_comm, analysis(**comm("all_reduce", 60 * MS)))
    assert ids(cpu) == ["exposed-comm-high"]
    # on gloo healthy runs expose up to exposed_comm_frac_sync of the step: 30 % is not a finding there
    assert run(comm_rules.exposed_comm, analysis(**comm("all_reduce", 30 * MS))) == []
    gpu = run(comm_rules.exposed_comm, analysis(traits=GPU, **comm("all_reduce", 30 * MS)))
    assert ids(gpu) == ["exposed-comm-high", "low-overlap"]
    assert run(comm_rules.exposed_comm, analysis(traits=GPU, **comm("all_reduce", 5 * MS, busy_us=20 * MS))) == []


def test_message_sizes():
    small = collectives(2, 4, "all_reduce", "backward", per_step=30, size_bytes=4096, exposed_us=100.0)
    assert ids(run(comm_rules.message_sizes, analysis(collective_events=small))) == ["latency-bound-collectives"]
    slow = collectives(2, 4, "all_reduce", "backward", size_bytes=64 << 20, busbw_gbps=5.0)
    assert ids(run(comm_rules.message_sizes, analysis(traits=GPU, collective_events=slow))) == ["low-bus-bandwidth"]
    fast = collectives(2, 4, "all_reduce", "backward", size_bytes=64 << 20, busbw_gbps=150.0)
    assert run(comm_rules.message_sizes, analysis(traits=GPU, collective_events=fast)) == []


def _ddp(**kw) -> DdpInfo:
    base = dict(allreduces_per_step=4, bucket_sizes_bytes=[], forwards_per_step=1, backwards_per_step=1,
                backwards_with_allreduce_per_step=1, search_unused_per_step=0, after_backward_frac=0.3,
                overlap_frac=0.5)
    return DdpInfo(**{**base, **kw})


def test_ddp_rules():
    one = collectives(2, 4, "all_reduce", "backward", nelems=2_000_000, exposed_us=10 * MS)
    found = run(ddp_rules.ddp_rules, analysis(signals=Signals(ddp=_ddp(overlap_frac=0.02)), collective_events=one))
    assert ids(found) == ["ddp-single-bucket"]
    # a bucket reduced during backward needs resources of its own: on a GPU (own stream) the fix's first
    # bucket hides under backward; where ranks share host cores (CPU/gloo) nothing is promised
    cpu = found[0]
    gpu = run(ddp_rules.ddp_rules, analysis(traits=GPU, signals=Signals(ddp=_ddp(overlap_frac=0.02)),
                                            collective_events=one))[0]
    assert cpu.impact_us == 0 and cpu.severity == "info" and "not expected to save time" in cpu.summary
    assert 0 < gpu.impact_us < 10 * MS and "not expected" not in gpu.summary
    assert f"up to {ms(gpu.impact_us)}" in " ".join(e.text for e in cpu.evidence)
    tiny = collectives(2, 4, "all_reduce", "backward", per_step=12, nelems=10_000, exposed_us=MS)
    assert ids(run(ddp_rules.ddp_rules, analysis(signals=Signals(ddp=_ddp()), collective_events=tiny))) == [
        "ddp-tiny-buckets"]
    unused = _ddp(search_unused_per_step=1, bucket_copies_per_step=10, grads_accumulated_per_step=10)
    four = collectives(2, 4, "all_reduce", "backward", per_step=4, nelems=2_000_000)
    assert ids(run(ddp_rules.ddp_rules, analysis(signals=Signals(ddp=unused), collective_events=four))) == [
        "ddp-find-unused-unneeded"]
    accum = _ddp(forwards_per_step=4, backwards_per_step=4, backwards_with_allreduce_per_step=4)
    assert "grad-accum-without-no-sync" in ids(run(ddp_rules.ddp_rules, analysis(signals=Signals(ddp=accum),
                                                                                 collective_events=four)))
    assert run(ddp_rules.ddp_rules, analysis(signals=Signals(ddp=_ddp()), collective_events=four)) == []


def _loader(rank: int, frac: float) -> DataLoaderInfo:
    return DataLoaderInfo(rank=rank, iterator="_SingleProcessDataLoaderIter", calls_per_step=1,
                          mean_call_us=frac * 100 * MS, stall_frac=frac, exposed_frac=frac)


def test_input_bound():
    sig = Signals(dataloader=[_loader(0, 0.3), _loader(1, 0.3)])
    found = run(host_rules.input_bound, analysis(signals=sig, data_loading_us=30 * MS))
    assert ids(found) == ["input-bound"] and found[0].severity == "error" and "num_workers=4" in found[0].fix
    assert run(host_rules.input_bound, analysis(signals=sig, data_loading_us=1 * MS)) == []


def test_straggler():
    found = run(host_rules.straggler, analysis(straggler=straggler_report(own_frame="job.py(9): slow")))
    assert ids(found) == ["straggler"] and found[0].ranks == [1] and "job.py(9): slow" in found[0].fix
    # a wait within the run's noise is no straggler
    assert run(host_rules.straggler, analysis(straggler=straggler_report(wait_us=2 * MS, noise_us=5 * MS))) == []


def test_host_sync():
    syncs = [HostSync(rank=r, name="aten::_local_scalar_dense", count=8, total_us=100.0, steps=[1, 2, 3, 4],
                      source="train.py(40): step") for r in (0, 1)]
    found = run(host_rules.host_sync, analysis(signals=Signals(host_syncs=syncs)))
    assert ids(found) == ["host-sync"] and found[0].impact_us == 0.0  # host-only trace: nothing waits
    rare = [HostSync(rank=0, name="aten::_local_scalar_dense", count=1, total_us=10.0, steps=[1])]
    assert run(host_rules.host_sync, analysis(signals=Signals(host_syncs=rare))) == []


def test_cpu_staged_collectives():
    gloo = Signals(setup=[_gloo_setup(0), _gloo_setup(1)])
    assert ids(run(setup_rules.cpu_staged_collectives, analysis(signals=gloo, **comm("all_reduce", 40 * MS)))) == [
        "cpu-staged-collectives"]
    cpu_job = Signals(setup=[_gloo_setup(0, kernels=0), _gloo_setup(1, kernels=0)])
    assert run(setup_rules.cpu_staged_collectives, analysis(signals=cpu_job)) == []


def test_ranks_never_communicate():
    silent = [RankSetup(rank=r, world_size=2, backend="undefined", has_backward=True) for r in (0, 1)]
    found = run(setup_rules.ranks_never_communicate, analysis(backend="undefined", signals=Signals(setup=silent)))
    assert ids(found) == ["ranks-never-communicate"]
    assert run(setup_rules.ranks_never_communicate, analysis(signals=Signals(setup=[_gloo_setup(0, 0),
                                                                                    _gloo_setup(1, 0)]))) == []


def test_wrapper_world_size_1():
    assert ids(run(setup_rules.wrapper_world_size_1, analysis(ranks=1))) == ["wrapper-world-size-1"]
    assert run(setup_rules.wrapper_world_size_1, analysis(ranks=2)) == []


def test_mixed_backends():
    mixed = Signals(setup=[_gloo_setup(0), _gloo_setup(1, backend="nccl")])
    assert ids(run(setup_rules.mixed_backends, analysis(signals=mixed))) == ["mixed-backends"]
    assert run(setup_rules.mixed_backends, analysis(signals=Signals(setup=[_gloo_setup(0), _gloo_setup(1)]))) == []


def test_gpu_idle():
    idle = Signals(gpu_idle=[_idle("launch", 40 * MS, r) for r in (0, 1)])
    assert ids(run(gpu_rules.gpu_idle, analysis(traits=GPU, signals=idle))) == ["gpu-idle"]
    assert run(gpu_rules.gpu_idle, analysis(traits=CPU, signals=idle)) == []  # no device timeline
    few = Signals(gpu_idle=[_idle("launch", 2 * MS, r) for r in (0, 1)])
    assert run(gpu_rules.gpu_idle, analysis(traits=GPU, signals=few)) == []


def test_gpu_idle_names_the_largest_part_it_cannot_fix():
    """Idle that is mostly host work outside torch ops (Python, I/O: 'other', which no launch fix
    shortens) with a smaller launch part (kineto's tb_plugin GPU-metrics input, param's linear trace): the
    title must not say the idle is mostly launch overhead; its impact is still the launch part."""
    def mixed(rank):
        g = _idle("launch", 20 * MS, rank)
        g.by_cause["other"] = 50 * MS
        g.idle_us, g.idle_frac = 70 * MS, 0.7
        return g
    f = run(gpu_rules.gpu_idle, analysis(traits=GPU, signals=Signals(gpu_idle=[mixed(r) for r in (0, 1)])))[0]
    assert "mostly" not in f.title and "28.6% of it kernel launch overhead" in f.title
    assert "50.0 ms" in f.summary and "does not shorten" in f.summary
    assert f.impact_us == pytest.approx(20 * MS)
    plain = run(gpu_rules.gpu_idle, analysis(traits=GPU, signals=Signals(gpu_idle=[_idle("launch", 40 * MS, r)
                                                                                    for r in (0, 1)])))[0]
    assert "mostly kernel launch overhead" in plain.title and "Most of it the host was launching" in plain.summary


def test_activation_recompute():
    rc = [RecomputeInfo(rank=r, method="checkpoint frames", regions_per_step=4, recompute_us=30 * MS,
                        recompute_frac=0.3, compute_frac=0.4) for r in (0, 1)]
    found = run(gpu_rules.activation_recompute, analysis(signals=Signals(recompute=rc)))
    assert ids(found) == ["activation-recompute"] and found[0].severity == "warning"
    rc_small = [RecomputeInfo(rank=0, method="x", regions_per_step=1, recompute_us=1 * MS, recompute_frac=0.01,
                              compute_frac=None)]
    assert run(gpu_rules.activation_recompute, analysis(signals=Signals(recompute=rc_small))) == []


def test_offload_exposed():
    off = [OffloadInfo(rank=r, h2d_us=20 * MS, d2h_us=0.0, exposed_us=15 * MS, copies_per_step=4,
                       by_phase={"forward": 15 * MS}) for r in (0, 1)]
    assert ids(run(gpu_rules.offload_exposed, analysis(traits=GPU, signals=Signals(offload=off)))) == [
        "offload-exposed"]
    low = [OffloadInfo(rank=0, h2d_us=1 * MS, d2h_us=0.0, exposed_us=0.5 * MS, copies_per_step=1)]
    assert run(gpu_rules.offload_exposed, analysis(traits=GPU, signals=Signals(offload=low))) == []


def test_every_registered_rule_has_a_unit_test_here():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    names = {r.fn.__name__ for r in RULES}
    aliases = {"fsdp1_backward_prefetch", "fsdp2_explicit_noop", "message_sizes", "ddp_rules"}
    missing = {n for n in names if n not in tested and n not in aliases
               and not any(n in t for t in tested)}
    assert not missing, f"rules without a unit test: {missing}"


# ------------------------------------------------------------------ the registry's declarations
def test_registry_declarations():
    assert len(RULE_IDS) == len(set(RULE_IDS))  # one rule per id
    for r in RULES:
        assert r.ids and all(t in BY_NAME for t in r.thresholds), r.name


def test_a_rule_reading_an_undeclared_threshold_or_emitting_an_undeclared_id_is_refused():
    @rule(ids=("demo",), thresholds=("input_bound_frac",))
    def reads_other(ctx: RuleContext) -> list[Finding]:
        return [] if ctx.th["gpu_idle_frac"] else []

    @rule(ids=("demo",))
    def emits_other(ctx: RuleContext) -> list[Finding]:
        return [ctx.finding("not-demo", "t", 0.0, "s", "f", confidence=1.0, evidence=[])]

    with pytest.raises(UndeclaredThreshold):
        run(reads_other, analysis())
    with pytest.raises(RuleDefect):
        run(emits_other, analysis())
    with pytest.raises(RuleDefect):
        rule(ids=("demo",), thresholds=("no_such_threshold",))


def test_small_message_threshold_reaches_the_collectives_table():
    events = collectives(2, 4, "all_reduce", "backward", size_bytes=512 << 10)
    a = analysis(collective_events=events)
    from fsdpdoctor.results import CollectiveStat

    a.collectives = [CollectiveStat(kind="all_reduce", phase="backward", count=8, per_step=1, total_us=0,
                                    exposed_us=0, mean_us=0, size_bytes=None, mean_size_bytes=None, busbw_gbps=None)]
    diagnose(a)
    assert a.collectives[0].small_messages == 8
    diagnose(a, {"small_message_bytes": 1024})
    assert a.collectives[0].small_messages == 0


# ------------------------------------------------------------------ folds: earned, or not made
def _diag(a, thresholds=None) -> dict[str, Finding]:
    return {f.id: f for f in run_rules(RULES, a, resolve(thresholds))}


def test_backend_fault_folds_the_communication_it_exposes():
    a = analysis(signals=Signals(setup=[_gloo_setup(0), _gloo_setup(1)]), **comm("all_reduce", 60 * MS))
    f = _diag(a)
    assert f["exposed-comm-high"].caused_by == "cpu-staged-collectives"
    assert f["exposed-comm-high"].severity == "info"


def test_backend_fault_does_not_fold_prefetch_settings():
    ag = collectives(2, 4, "all_gather", "backward", per_step=4, exposed_us=3 * MS)
    a = analysis(wrapping="fsdp1", prefetch=_fsdp1("none"), collective_events=ag,
                 signals=Signals(setup=[_gloo_setup(0), _gloo_setup(1)]), **comm("all_gather", 60 * MS))
    f = _diag(a)
    assert "cpu-staged-collectives" in f
    prefetch = f["fsdp1-no-backward-prefetch"]
    assert prefetch.caused_by is None and prefetch.severity == "info"  # its own root; nil saving on gloo


def test_backend_fault_does_not_fold_a_rank_late_in_its_own_frames_nor_count_its_wait():
    setups = Signals(setup=[_gloo_setup(0), _gloo_setup(1)], sleep_sources={1: "job.py(5): train"})
    late = straggler_report(wait_us=30 * MS, own_frame="job.py(5): train")
    # the sleep is idle time (roots claim only what is not busy: the budget is the step less the compute)
    f = _diag(analysis(signals=setups, straggler=late, idle_us=30 * MS, **comm("all_reduce", 60 * MS)))
    assert f["straggler"].caused_by is None and f["straggler"].severity == "error"
    # 60 ms exposed per rank and step on average; rank 0 waits 30 ms for the sleeper, rank 1 not at all:
    # 15 ms of the mean is the wait, and NCCL would give back at most the other 45
    assert f["cpu-staged-collectives"].impact_us == pytest.approx(45 * MS)
    # the same rank, late without a frame of its own (the same work, slower): the backend may explain it
    slower = straggler_report(wait_us=30 * MS, cause="compute", own_frame=None)
    f = _diag(analysis(signals=Signals(setup=setups.setup), straggler=slower, **comm("all_reduce", 60 * MS)))
    assert f["straggler"].caused_by == "cpu-staged-collectives"


def test_straggler_folds_the_communication_that_waits_for_it_but_not_a_prefetch_setting():
    # 40 ms of exposed forward gathers per step, 25 ms of it the wait for the straggler: 15 ms survive its fix
    ag = collectives(2, 4, "all_gather", "forward", per_step=4, exposed_us=10 * MS)
    late = straggler_report(wait_us=50 * MS, own_frame="job.py(5): train", kind="all_gather", phase="forward")
    # on a GPU (on gloo a prefetch saves nothing): 15 ms, under the forward compute (1/3 of 50 ms)
    # the straggler's 50 ms are idle on its peers: a 150 ms step keeps 50 ms of compute beside them
    f = _diag(analysis(traits=GPU, backend="nccl", wrapping="fsdp1", prefetch=_fsdp1(forward="off"), step_ms=150.0,
                       idle_us=50 * MS, collective_events=ag, straggler=late, **comm("all_gather", 50 * MS)))
    assert f["exposed-comm-high"].caused_by == "straggler"
    assert f["fsdp-forward-prefetch-off"].caused_by is None
    assert f["fsdp-forward-prefetch-off"].impact_us == pytest.approx(15 * MS)
    # exposed communication that is mostly not waiting for it stays a root
    small = straggler_report(wait_us=10 * MS, own_frame="job.py(5): train")
    f = _diag(analysis(straggler=small, **comm("all_reduce", 80 * MS)))
    assert f["straggler"].consequences == [] and f["exposed-comm-high"].caused_by is None


def test_a_straggler_claims_the_communication_only_its_own_lateness_holds():
    """Eight ranks arriving one after another (facebookresearch/param's DLRM traces): the last one's peers
    wait 50 ms for it, but the next-latest arrives 2 ms before it, so on time it would save 2 ms. The
    exposed communication is the spread of all arrivals, not this rank's: it stays a root."""
    spread = replace(straggler_report(wait_us=50 * MS, own_frame="job.py(5): train"), saving_us=2 * MS)
    f = _diag(analysis(ranks=8, straggler=spread, **comm("all_reduce", 60 * MS)))
    assert f["straggler"].impact_us == pytest.approx(2 * MS)
    assert f["straggler"].consequences == [] and f["exposed-comm-high"].caused_by is None
    # 50 ms is the longest wait; the others wait between 2 and 50 ms, for every rank arriving after them
    assert "wait up to 50.0 ms" in f["straggler"].summary
    assert "waiting for ranks that arrive later" in f["exposed-comm-high"].summary
    # the same wait where the next-latest rank was on time: its lateness is the communication's cause
    alone = straggler_report(wait_us=50 * MS, own_frame="job.py(5): train")
    f = _diag(analysis(straggler=alone, **comm("all_reduce", 60 * MS)))
    assert f["exposed-comm-high"].caused_by == "straggler"


def test_input_bound_folds_a_rank_late_in_its_loader_and_not_a_sleeper():
    sig = Signals(dataloader=[_loader(0, 0.01), _loader(1, 0.6)])
    loader_late = straggler_report(wait_us=60 * MS, cause="data loading", own_frame="data.py(3): __getitem__")
    f = _diag(analysis(signals=sig, straggler=loader_late, data_loading_us=30 * MS, idle_us=30 * MS))
    assert f["straggler"].caused_by == "input-bound"
    assert f["input-bound"].impact_us == pytest.approx(60 * MS)  # the others' wait is the loader's saving
    sleeper = straggler_report(wait_us=60 * MS, cause="sleep", own_frame="job.py(5): train")
    f = _diag(analysis(signals=sig, straggler=sleeper, data_loading_us=30 * MS))
    assert f["straggler"].caused_by is None and f["input-bound"].caused_by is None


def test_gpu_idle_folds_under_what_the_gpu_waits_for():
    loading = Signals(dataloader=[_loader(0, 0.4), _loader(1, 0.4)],
                      gpu_idle=[_idle("data_loading", 40 * MS, r) for r in (0, 1)])
    f = _diag(analysis(traits=GPU, backend="nccl", signals=loading, data_loading_us=40 * MS))
    assert f["gpu-idle"].caused_by == "input-bound"
    launch = Signals(dataloader=[_loader(0, 0.1), _loader(1, 0.1)],
                     gpu_idle=[_idle("launch", 40 * MS, r) for r in (0, 1)])
    f = _diag(analysis(traits=GPU, backend="nccl", signals=launch, data_loading_us=10 * MS))
    assert f["gpu-idle"].caused_by is None
    waits = Signals(setup=[_gloo_setup(0), _gloo_setup(1)], gpu_idle=[_idle("collective_wait", 40 * MS, r)
                                                                       for r in (0, 1)])
    assert _diag(analysis(traits=GPU, signals=waits))["gpu-idle"].caused_by == "cpu-staged-collectives"
    nccl = Signals(setup=[_gloo_setup(0, backend="nccl"), _gloo_setup(1, backend="nccl")],
                   gpu_idle=[_idle("collective_wait", 40 * MS, r) for r in (0, 1)])
    assert _diag(analysis(traits=GPU, backend="nccl", signals=nccl))["gpu-idle"].caused_by is None


def test_world_size_1_folds_what_cannot_be_judged_at_one_rank():
    ag = collectives(1, 4, "all_gather", "backward", per_step=4, exposed_us=3 * MS)
    f = _diag(analysis(ranks=1, wrapping="fsdp1", prefetch=_fsdp1("none"), collective_events=ag))
    assert f["fsdp1-no-backward-prefetch"].caused_by == "wrapper-world-size-1"
    f = _diag(analysis(ranks=2, wrapping="fsdp1", prefetch=_fsdp1("none"), collective_events=ag))
    assert f["fsdp1-no-backward-prefetch"].caused_by is None


# ------------------------------------------------------------------ bounded impacts, thin evidence
def test_no_impact_above_the_step_and_roots_together_within_it():
    # GPU host syncs whose bubbles add up past the step (each bubble counted per sync), beside a loader stall
    syncs = [HostSync(rank=r, name="cudaStreamSynchronize", count=40, total_us=1 * MS, steps=[1, 2, 3, 4],
                      source="train.py(7): step", bubble_us=4 * 300 * MS) for r in (0, 1)]
    sig = Signals(host_syncs=syncs, dataloader=[_loader(0, 0.5), _loader(1, 0.5)])
    found = run_rules(RULES, analysis(traits=GPU, backend="nccl", signals=sig, data_loading_us=50 * MS),
                      resolve(None))
    assert all(f.impact_us <= 100 * MS + 1e-6 and f.impact_frac <= 1.0 for f in found)
    roots = [f for f in found if not f.caused_by]
    assert len(roots) >= 2 and sum(f.impact_us for f in roots) <= 100 * MS + 1e-6
    trimmed = [f for f in roots if any("impact limited" in e.text for e in f.evidence)]
    assert trimmed and all(f.severity != "error" or f.impact_frac * f.confidence >= 0.25 for f in trimmed)


def test_findings_in_the_exposed_communication_claim_it_once():
    """FSDP1 without backward prefetch whose all-gathers overlap each other (summed call by call: 60 ms a
    step) and slow large all-reduces (30 ms), in a step with 40 ms of exposed communication: no finding
    claims more than the 40 ms, the roots drawing on it claim it once, and a clipped one says why."""
    ag = collectives(2, 4, "all_gather", "backward", per_step=4, dur_us=16 * MS, exposed_us=15 * MS)
    ar = collectives(2, 4, "all_reduce", "backward", dur_us=30 * MS, exposed_us=30 * MS, size_bytes=64 << 20,
                     busbw_gbps=2.0)
    found = run_rules(RULES, analysis(traits=GPU, backend="nccl", wrapping="fsdp1", prefetch=_fsdp1("none"),
                                      collective_events=ag + ar, **comm("all_gather", 40 * MS)), resolve(None))
    by_id = {f.id: f for f in found}
    assert {"fsdp1-no-backward-prefetch", "low-bus-bandwidth"} <= set(by_id)
    in_comm = [f for f in found if f.id in ("exposed-comm-high", "low-overlap", "fsdp1-no-backward-prefetch",
                                            "low-bus-bandwidth", "latency-bound-collectives")]
    assert all(f.impact_us <= 40 * MS + 1e-6 for f in in_comm)
    assert sum(f.impact_us for f in in_comm if not f.caused_by) <= 40 * MS + 1e-6
    pf = by_id["fsdp1-no-backward-prefetch"]
    # a prefetch hides the gathers only under the backward compute there is: 2/3 of the 60 ms of compute
    assert "only under the backward compute" in pf.summary and "40.0 ms per step of the 60.0 ms" in pf.summary


def test_a_rule_declares_parts_only_of_its_own_ids_and_known_parts():
    with pytest.raises(RuleDefect):
        rule(ids=("a",), parts={"b": "exposed_comm_us"})
    with pytest.raises(RuleDefect):
        rule(ids=("a",), parts={"a": "exposed_comm"})


def test_one_step_of_one_rank_is_at_most_info_and_says_why():
    """One step of one rank is one sample: no noise to judge a saving against, so no alarm (issue 28:
    severity follows evidence); the finding says that more steps decide it."""
    sig = Signals(dataloader=[_loader(0, 0.6)])
    thin = {f.id: f for f in run_rules(RULES, analysis(ranks=1, steps=1, signals=sig, wrapping="none",
                                                       data_loading_us=60 * MS), resolve(None))}
    assert thin["input-bound"].severity == "info"
    assert any("the window holds one step" in e.text for e in thin["input-bound"].evidence)
    assert "profile more steps" in thin["input-bound"].summary
    for ranks, steps in ((1, 2), (2, 1)):
        sig = Signals(dataloader=[_loader(r, 0.6) for r in range(ranks)])
        found = {f.id: f for f in run_rules(RULES, analysis(ranks=ranks, steps=steps, signals=sig, wrapping="none",
                                                            data_loading_us=60 * MS), resolve(None))}
        assert found["input-bound"].severity == "error", (ranks, steps)


def test_evidence_type_is_the_results_one():
    # the framework appends Evidence of the shared result type (renderers read it)
    f = run_rules(RULES, analysis(ranks=1, steps=1, signals=Signals(dataloader=[_loader(0, 0.6)]), wrapping="none",
                                  data_loading_us=60 * MS), resolve(None))[0]
    assert all(isinstance(e, Evidence) for e in f.evidence)


def test_low_overlap_is_the_exposed_time_seen_as_overlap_and_moves_with_it():
    f = _diag(analysis(traits=GPU, backend="nccl", **comm("all_reduce", 30 * MS)))
    assert f["low-overlap"].caused_by == "exposed-comm-high" and f["exposed-comm-high"].caused_by is None
    # when the exposed time is the wait for a straggler, both go under the straggler (one level)
    late = straggler_report(wait_us=50 * MS, own_frame="job.py(5): train")
    f = _diag(analysis(traits=GPU, backend="nccl", straggler=late, **comm("all_reduce", 60 * MS)))
    assert f["exposed-comm-high"].caused_by == "straggler" and f["low-overlap"].caused_by == "straggler"


def test_mixed_backends_fold_the_communication_not_a_setting_nor_a_sleeper():
    mixed = [_gloo_setup(0, kernels=0), _gloo_setup(1, kernels=0, backend="nccl")]  # no CUDA tensors
    ag = collectives(2, 4, "all_gather", "backward", per_step=4, exposed_us=3 * MS)
    late = straggler_report(wait_us=30 * MS, own_frame="job.py(5): train")
    f = _diag(analysis(wrapping="fsdp1", prefetch=_fsdp1("none"), collective_events=ag, straggler=late,
                       signals=Signals(setup=mixed), **comm("all_gather", 60 * MS)))
    assert f["mixed-backends"].caused_by is None
    assert f["exposed-comm-high"].caused_by in ("mixed-backends", "straggler")
    assert f["fsdp1-no-backward-prefetch"].caused_by is None and f["straggler"].caused_by is None
    slower = straggler_report(wait_us=30 * MS, cause="compute", own_frame=None)
    f = _diag(analysis(signals=Signals(setup=mixed), straggler=slower, **comm("all_reduce", 60 * MS)))
    assert f["straggler"].caused_by == "mixed-backends"


def test_gpu_idle_waiting_for_a_sleeper_is_the_sleepers_not_the_backends():
    # rank 0's host blocks 30 ms per step in the all-reduce waiting for rank 1, who sleeps in its own frame
    waits = Signals(setup=[_gloo_setup(0), _gloo_setup(1)], sleep_sources={1: "job.py(5): train"},
                    gpu_idle=[_idle("collective_wait", 30 * MS, 0), _idle("collective_wait", 0.0, 1)])
    late = straggler_report(wait_us=30 * MS, own_frame="job.py(5): train")
    f = _diag(analysis(traits=GPU, signals=waits, straggler=late, **comm("all_reduce", 15 * MS)))
    assert f["gpu-idle"].caused_by == "straggler" and "gpu-idle" not in f["cpu-staged-collectives"].consequences
    # the same idle with no rank late in its own work: gloo staging is what the GPU waits for
    f = _diag(analysis(traits=GPU, signals=waits, **comm("all_reduce", 15 * MS)))
    assert f["gpu-idle"].caused_by == "cpu-staged-collectives"


def test_a_rank_given_more_work_is_never_the_backends():
    skew = straggler_report(wait_us=30 * MS, cause="more work", own_frame=None)
    f = _diag(analysis(signals=Signals(setup=[_gloo_setup(0), _gloo_setup(1)]), straggler=skew,
                       **comm("all_reduce", 60 * MS)))
    assert f["straggler"].caused_by is None and "(more work)" in f["straggler"].title
    assert "length" in f["straggler"].fix


def test_every_threshold_a_rule_reads_is_declared_in_its_source():
    """A rule reading an undeclared threshold in a branch no test reaches would stop the diagnosis: read
    the sources instead. Helpers beside the rules read no thresholds (they run under any rule)."""
    import inspect
    import re

    from fsdpdoctor.diagnose.rules import RULE_MODULES, rules_of

    read = re.compile(r"""ctx\.th\[["']([a-z_]+)["']\]""")
    for module in RULE_MODULES:
        rules = {r.fn.__name__: r for r in rules_of(module)}
        for name, obj in vars(module).items():
            fn = obj.fn if name in rules else obj
            if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            names = set(read.findall(inspect.getsource(fn)))
            allowed = set(rules[name].thresholds) if name in rules else set()
            assert names <= allowed, f"{module.__name__}.{name} reads {names - allowed} undeclared"


def test_backend_fault_does_not_fold_many_small_collectives():
    small = collectives(2, 4, "all_reduce", "backward", per_step=30, size_bytes=4096, exposed_us=100.0)
    f = _diag(analysis(signals=Signals(setup=[_gloo_setup(0), _gloo_setup(1)]), collective_events=small,
                       **comm("all_reduce", 60 * MS)))
    assert f["latency-bound-collectives"].caused_by is None  # NCCL still pays a latency per call
    assert f["exposed-comm-high"].caused_by == "cpu-staged-collectives"


def test_each_rule_runs_once_even_where_a_module_imports_another_modules_rule():
    from fsdpdoctor.diagnose.rules import rules_of

    prefetch_rules.borrowed = host_rules.straggler  # as `from host_rules import straggler` would
    try:
        assert host_rules.straggler not in rules_of(prefetch_rules)
    finally:
        del prefetch_rules.borrowed
    assert len({id(r) for r in RULES}) == len(RULES)


# ------------------------------------------------------------------ what a recording can say (corpus findings)
def test_single_bucket_needs_gradient_all_reduces_and_peers():
    one = collectives(2, 4, "all_reduce", "backward", nelems=2_000_000, exposed_us=10 * MS)
    single = Signals(ddp=_ddp(overlap_frac=0.02))
    assert ids(run(ddp_rules.ddp_rules, analysis(signals=single, collective_events=one))) == ["ddp-single-bucket"]
    # a DDP forward and nothing reduced (a host-only trace): the bucket layout is not in the trace
    assert run(ddp_rules.ddp_rules, analysis(signals=single, collective_events=[])) == []
    # world size 1: nothing to overlap with, whatever the buckets
    alone = collectives(1, 4, "all_reduce", "backward", nelems=2_000_000, exposed_us=10 * MS)
    assert run(ddp_rules.ddp_rules, analysis(ranks=1, signals=single, collective_events=alone)) == []


def _unmarked(a):
    """The same run recorded without ProfilerStep: each rank's one window has no step number."""
    a.job.steps = []
    for r in a.ranks:
        r.steps = [replace(s, step=None) for s in r.steps[:1]]
    return a


def test_without_step_markers_findings_are_notes_and_say_why():
    sig = Signals(dataloader=[_loader(r, 0.6) for r in (0, 1)])
    marked = {f.id: f for f in run_rules(RULES, analysis(signals=sig, wrapping="none", data_loading_us=60 * MS),
                                         resolve(None))}
    assert marked["input-bound"].severity == "error"
    bare = analysis(signals=sig, wrapping="none", data_loading_us=60 * MS)
    found = {f.id: f for f in run_rules(RULES, _unmarked(bare), resolve(None))}
    assert found["input-bound"].severity == "info"
    assert any("no step markers" in e.text for e in found["input-bound"].evidence)


def test_gpu_idle_in_a_graph_capture_is_not_launch_overhead():
    def idle(captured_us):
        g = [_idle("launch", 90 * MS, r) for r in (0, 1)]
        for x in g:
            x.graph_captures, x.capture_idle_us = (1 if captured_us else 0), captured_us
        return Signals(gpu_idle=g)
    plain = run(gpu_rules.gpu_idle, analysis(traits=GPU, signals=idle(0.0)))
    assert plain[0].severity == "error" and "launch overhead" in plain[0].title
    cap = run(gpu_rules.gpu_idle, analysis(traits=GPU, signals=idle(80 * MS)))
    assert ids(cap) == ["gpu-idle"] and cap[0].severity == "info"
    assert "CUDA-graph capture" in cap[0].title and "launch overhead" not in cap[0].title
    assert cap[0].impact_us == pytest.approx(10 * MS)   # only the idle outside the capture


def test_a_step_under_the_timer_resolution_gives_no_finding():
    sig = Signals(dataloader=[_loader(r, 0.6) for r in (0, 1)])
    tiny = analysis(step_ms=0.0003, signals=sig, wrapping="none", data_loading_us=0.18)
    assert run_rules(RULES, tiny, resolve(None)) == []
    assert any("timer resolution" in n for n in tiny.notes)
    # 20 us is the floor with the default bands (1 us tick / severity_warning_frac): just above it, findings
    short = analysis(step_ms=0.025, signals=sig, wrapping="none", data_loading_us=15.0)
    assert "input-bound" in ids(run_rules(RULES, short, resolve(None))) and not short.notes


def test_a_marker_step_is_not_a_step():
    from fsdpdoctor.analysis.breakdown import StepWindow
    from fsdpdoctor.analysis.map_reduce import marker_windows
    # hta-mi250-toy-train's shape: a 9.3 ms step, then a 49 us ProfilerStep with nothing in it
    real, marker = StepWindow(1, 0.0, 9325.0), StepWindow(2, 9325.0, 9374.0)
    assert marker_windows([real, marker]) == [marker]
    # a short step that still works (a tenth of the others) and a long one spanning a gap are steps
    steps = [StepWindow(i, i * 1e4, i * 1e4 + d) for i, d in enumerate((9e3, 9e3, 900.0, 9e5))]
    assert marker_windows(steps) == []
    assert marker_windows([real]) == []


def test_periodic_stall():
    """A stall every 4th step on rank 0, averaged over every step: fires above 5 % of the step with the fix
    that fits its frame; a small one does not."""
    from fsdpdoctor.diagnose import periodic_rules
    from fsdpdoctor.results import PeriodicStall

    def stall(cost_us, frame):
        return PeriodicStall(rank=0, period=4, offset=3, stalled_steps=[7, 11, 15], excess_us=4 * cost_us,
                             cost_per_step_us=cost_us, source="step series", owner_evidence="rank 0's long steps "
                             "start first", median_step_us=100e3, ranks_showing=[0, 1], frame=frame)

    a = analysis()
    a.periodic = stall(20e3, "train.py(52): save_checkpoint")
    found = run(periodic_rules.periodic_stall, a)
    assert ids(found) == ["periodic-stall"] and found[0].ranks == [0]
    assert "every 4th step" in found[0].title and "async_save" in found[0].fix
    a.periodic = stall(20e3, "train.py(80): run_validation")
    assert "evaluate on every rank" in run(periodic_rules.periodic_stall, a)[0].fix
    a.periodic = stall(2e3, "train.py(52): save_checkpoint")
    assert run(periodic_rules.periodic_stall, a) == []


def test_fsdp_single_unit():
    """FSDP with one unit (manifest) gets the wrap that fixes it and the unsharded memory; more units do not."""
    from fsdpdoctor.diagnose import wrapping_rules

    a = analysis(wrapping="fsdp2", wrapping_source="manifest", wrapping_details={"kind": "fsdp2", "units": 1},
                 manifest={"model": {"parameters": 1200000, "param_bytes": 4800000}})
    found = run(wrapping_rules.single_unit, a)
    assert ids(found) == ["fsdp-single-unit"] and found[0].severity == "warning"
    assert "fully_shard(block)" in found[0].fix and "4.8 MB" in found[0].summary
    a = analysis(wrapping="fsdp1", wrapping_source="manifest", wrapping_details={"kind": "fsdp1", "units": 7})
    assert run(wrapping_rules.single_unit, a) == []


# ------------------------------------------------------------------ metric sync (diagnose/metric_rules.py)
def _issued(colls, issuer, source=None, exposed_by_rank=None):
    for c in colls:
        c.issuer, c.source = issuer, source
        if exposed_by_rank:
            c.exposed_us = exposed_by_rank[c.rank]
    return colls


def test_metric_sync_priced_at_each_calls_own_time_with_the_metrics_fix():
    from fsdpdoctor.diagnose.metric_rules import metric_sync
    # torchmetrics' per-step sync: 10 all-gathers and 6 barriers; rank 0 waits 2 ms for rank 1 in each
    gathers = _issued(collectives(2, 4, "all_gather", "forward", per_step=10, size_bytes=32),
                      "metrics (torchmetrics: forward)", "train.py(80): train_step", {0: 3 * MS, 1: 1 * MS})
    barriers = _issued(collectives(2, 4, "barrier", "forward", per_step=6, size_bytes=1),
                       "metrics (torchmetrics: forward)", "train.py(80): train_step", {0: 3 * MS, 1: 1 * MS})
    a = analysis(step_ms=100.0, collective_events=gathers + barriers, **comm("all_gather", 32 * MS))
    found = run(metric_sync, a)
    assert ids(found) == ["metric-sync"] and found[0].severity == "warning"
    f = found[0]
    assert f.impact_us == pytest.approx(16 * MS)   # the least of the ranks' time in each call, not the wait
    assert "dist_sync_on_step=False" in f.fix and "bucket" not in f.fix
    assert "10 all_gather, 6 barrier" in f.summary and f.source == "train.py(80): train_step"
    # under the threshold's share of the step: no finding
    assert run(metric_sync, a, {"metric_sync_frac": 0.2}) == []


def test_metric_sync_user_code_outside_the_model_only():
    from fsdpdoctor.diagnose.metric_rules import metric_sync
    user = _issued(collectives(2, 4, "all_reduce", "other", per_step=8, size_bytes=4, exposed_us=1 * MS),
                   "user code train.py(91): log_loss", "train.py(91): log_loss")
    f = run(metric_sync, analysis(collective_events=user, **comm("all_reduce", 8 * MS)))
    assert ids(f) == ["metric-sync"] and "one collective" in f[0].fix and "train.py(91): log_loss" in f[0].fix
    assert f[0].confidence < 0.8   # the trace names no metrics library
    # the same calls moving gradients (a hand-written all-reduce of 4 MB each) are the model's, not bookkeeping
    grads = _issued(collectives(2, 4, "all_reduce", "other", per_step=8, size_bytes=4 << 20, exposed_us=1 * MS),
                    "user code train.py(60): average_gradients", "train.py(60): average_gradients")
    assert run(metric_sync, analysis(collective_events=grads, **comm("all_reduce", 8 * MS))) == []
    # the model's own collectives, whatever their number: gradient buckets, clipping, optimizer-state sharding,
    # SyncBN, and user code inside backward or the optimizer step
    model = (_issued(collectives(2, 4, "all_reduce", "backward", per_step=8, exposed_us=1 * MS), "gradient buckets")
             + _issued(collectives(2, 4, "all_reduce", "other", per_step=8, exposed_us=1 * MS), "clip_grad_norm_")
             + _issued(collectives(2, 4, "broadcast", "optimizer", per_step=8, exposed_us=1 * MS),
                       "optimizer-state sharding")
             + _issued(collectives(2, 4, "all_gather", "forward", per_step=8, exposed_us=1 * MS),
                       "norm statistics (SyncBatchNorm)")
             + _issued(collectives(2, 4, "all_reduce", "backward", per_step=8, exposed_us=1 * MS),
                       "user code train.py(50): backward", "train.py(50): backward"))
    assert run(metric_sync, analysis(collective_events=model, **comm("all_reduce", 40 * MS))) == []
