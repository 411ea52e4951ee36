"""CPU/gloo dialect on the bundled 2-rank traces, checked against plain-JSON counts and a
pure-Python interval computation written here, independent of fsdpdoctor.analysis."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from intervals_ref import merge

from fsdpdoctor.pipeline import open_analysis
from bundled import TRACES  # the committed traces, in a pristine copy


# the c10d op names -> kind, written out independently of fsdpdoctor.analysis.collectives
C10D_KIND = {"c10d::allreduce_": "all_reduce", "c10d::allreduce_coalesced_": "all_reduce",
             "c10d::_allgather_base_": "all_gather", "c10d::allgather_": "all_gather",
             "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::broadcast_": "broadcast"}


def events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def steps(evs) -> dict[int, tuple[float, float]]:
    out = {}
    for e in evs:
        m = re.match(r"ProfilerStep#(\d+)$", e.get("name", ""))
        if m and e.get("ph") == "X":
            out[int(m.group(1))] = (e["ts"], e["ts"] + e["dur"])
    return out




def length(iv):
    return sum(e - s for s, e in iv)


def inter(a, b):
    out = []
    for s1, e1 in a:
        for s2, e2 in b:
            s, e = max(s1, s2), min(e1, e2)
            if e > s:
                out.append([s, e])
    return merge(out)


@pytest.mark.parametrize("scenario", ["fsdp1_backward_pre", "fsdp2_default", "ddp_default", "ddp_tiny_buckets"])
def test_collective_kinds_per_step(scenario):
    a = open_analysis(TRACES / scenario)
    for rank in (0, 1):
        evs = events(TRACES / scenario / f"rank{rank}.json.gz")
        want = Counter()
        for st, (s, e) in steps(evs).items():
            for ev in evs:
                if ev.get("ph") == "X" and ev.get("cat") == "cpu_op" and ev["name"] in C10D_KIND and s <= ev["ts"] < e:
                    want[(st, C10D_KIND[ev["name"]])] += 1
        got = Counter((c.step, c.kind) for c in a.collective_events if c.rank == rank)
        assert got == want


def test_gloo_reduce_scatter_is_not_all_reduce():
    """gloo executes reduce-scatter as gloo:all_reduce; the kind must come from the c10d op."""
    a = open_analysis(TRACES / "fsdp1_backward_pre")
    evs = events(TRACES / "fsdp1_backward_pre" / "rank0.json.gz")
    n_rs = sum(1 for e in evs if e.get("name") == "c10d::_reduce_scatter_base_" and e.get("ph") == "X")
    n_gloo_ar = sum(1 for e in evs if e.get("name") == "gloo:all_reduce" and e.get("ph") == "X")
    ours = Counter(c.kind for c in a.collective_events if c.rank == 0)
    assert n_rs > 0 and n_gloo_ar >= n_rs
    assert ours["reduce_scatter"] == n_rs
    assert ours["all_reduce"] == 0


@pytest.mark.parametrize("scenario", ["ddp_default", "ddp_one_bucket", "fsdp1_no_backward_prefetch", "fsdp2_default"])
def test_overlap_and_exposed_match_independent_computation(scenario):
    """comm = gloo worker spans; compute = main-thread cpu ops minus c10d ops and DataLoader time."""
    a = open_analysis(TRACES / scenario)
    for rank in (0, 1):
        evs = events(TRACES / scenario / f"rank{rank}.json.gz")
        xs = [e for e in evs if e.get("ph") == "X"]
        step_ev = [e for e in xs if e["name"].startswith("ProfilerStep#")]
        main = (step_ev[0]["pid"], step_ev[0]["tid"])
        bwd_threads = {(e["pid"], e["tid"]) for e in xs if e["name"].startswith("autograd::engine::evaluate_function")}
        threads = {main} | bwd_threads
        ops = [e for e in xs if e.get("cat") == "cpu_op" and (e["pid"], e["tid"]) in threads]
        comm_ops = merge([(e["ts"], e["ts"] + e["dur"]) for e in ops
                          if e["name"].startswith(("c10d::", "record_param_comms"))])
        dl = merge([(e["ts"], e["ts"] + e["dur"]) for e in xs if e["name"].startswith("enumerate(DataLoader)")
                    and (e["pid"], e["tid"]) == main])
        compute = merge([(e["ts"], e["ts"] + e["dur"]) for e in ops if not e["name"].startswith(("c10d::", "record_param_comms"))])
        # compute minus comm ops minus data loading: remove covered parts by intersecting with the complement
        lo, hi = min(e["ts"] for e in xs) - 1, max(e["ts"] + e["dur"] for e in xs) + 1
        def complement(iv, lo=lo, hi=hi):
            out, cur = [], lo
            for s, e in iv:
                if s > cur:
                    out.append([cur, s])
                cur = max(cur, e)
            out.append([cur, hi])
            return out
        gloo = merge([(e["ts"], e["ts"] + e["dur"]) for e in xs if e["name"].startswith("gloo:")])
        # not compute: the blocking Work.wait frames, and FSDP hook annotations while a collective runs
        waits = merge([(e["ts"], e["ts"] + e["dur"]) for e in xs if e["name"].startswith("<built-in method wait of")
                       and (e["pid"], e["tid"]) in threads])
        hooks = merge([(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("cat") == "user_annotation"
                       and e["name"].startswith(("FullyShardedDataParallel.", "FSDP::"))
                       and not e["name"].endswith(".forward")])
        not_compute = merge(comm_ops + dl + waits + inter(hooks, gloo))
        compute = inter(compute, complement(not_compute))
        ours = {s.step: s for s in next(r for r in a.ranks if r.rank == rank).steps}
        for st, (s, e) in steps(evs).items():
            comm = inter(gloo, [[s, e]])
            comp = inter(compute, [[s, e]])
            overlapped = length(inter(comm, comp))
            assert ours[st].comm_us == pytest.approx(length(comm), abs=0.5)
            assert ours[st].overlapped_comm_us == pytest.approx(overlapped, abs=0.5)
            assert ours[st].exposed_comm_us == pytest.approx(length(comm) - overlapped, abs=0.5)
            if "fsdp" in scenario:  # synchronous collectives on gloo overlap nothing (fsdp-signatures.md §4)
                assert ours[st].overlapped_comm_us < 0.01 * ours[st].comm_us
            # the parts add up to the step
            b = ours[st]
            total = b.compute_us + b.optimizer_us + b.exposed_comm_us + b.data_loading_us + b.idle_us
            assert total == pytest.approx(b.duration_us, rel=1e-6)


def test_prefetch_status_matches_configuration():
    expected = {"fsdp1_backward_pre": ("pre", "off"), "fsdp1_backward_post": ("post", "off"),
                "fsdp1_no_backward_prefetch": ("none", "off"), "fsdp1_forward_prefetch": ("pre", "on"),
                "fsdp2_default": ("pre", "off"), "fsdp2_no_backward_prefetch": ("none", "off"),
                "fsdp2_empty_prefetch_list": ("pre", "off")}
    for scenario, (bwd, fwd) in expected.items():
        manifest = json.loads((TRACES / scenario / "manifest.json").read_text())
        p = open_analysis(TRACES / scenario).prefetch
        assert (p.backward_mode, p.forward_mode) == (bwd, fwd), scenario
        if manifest["wrapping"]["kind"] == "fsdp1":
            configured = {"BACKWARD_PRE": "pre", "BACKWARD_POST": "post", None: "none"}
            assert configured[manifest["wrapping"]["backward_prefetch"]] == bwd
            assert manifest["wrapping"]["forward_prefetch"] == (fwd == "on")


@pytest.mark.parametrize("scenario", ["fsdp1_backward_pre", "fsdp1_backward_post", "fsdp1_no_backward_prefetch",
                                      "fsdp1_forward_prefetch", "fsdp2_default", "fsdp2_no_backward_prefetch"])
def test_prefetch_from_python_frames_without_annotations(scenario, tmp_path):
    """Traces whose FSDP record_function labels are gone (older torch, filtered exports) fall back to the
    Python frames (_prefetch_handle / _prefetch_unshard and the hook around them): same verdict."""
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((TRACES / scenario / f"rank{rank}.json.gz").read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not str(e.get("name", "")).startswith(("FullyShardedDataParallel.", "FSDP::"))]
        (tmp_path / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    frames, labels = open_analysis(tmp_path).prefetch, open_analysis(TRACES / scenario).prefetch
    assert (frames.framework, frames.backward_mode, frames.forward_mode, frames.backward_prefetched) == \
        (labels.framework, labels.backward_mode, labels.forward_mode, labels.backward_prefetched)
