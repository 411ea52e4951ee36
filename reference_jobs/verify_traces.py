"""Check, with plain json+gzip (no fsdpdoctor analyzer), that each recorded
scenario shows its injected problem the way docs in fsdp-signatures describe.

    python reference_jobs/verify_traces.py [traces]

Prints per-run counts (per profiled step, rank 0 unless noted). Exit 1 if an
expected signature is missing.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


class RankTrace:
    def __init__(self, data: dict, rank: int | None = None):
        # a job without a process group has no distributedInfo: the rank is in the file name
        self.dist = data.get("distributedInfo")
        self.rank = self.dist["rank"] if self.dist else rank
        evs = [e for e in data["traceEvents"] if e.get("ph") == "X"]
        self.steps = sorted((e for e in evs if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        main_tid = self.steps[0]["tid"] if self.steps else None
        self.main = sorted((e for e in evs if e["tid"] == main_tid), key=lambda e: e["ts"])
        self.all = evs

    def in_step(self, e, step):
        return step["ts"] <= e["ts"] < step["ts"] + step["dur"]

    def per_step(self, pred, events=None) -> list[int]:
        events = self.main if events is None else events
        return [sum(1 for e in events if pred(e) and self.in_step(e, s)) for s in self.steps]

    def ms_per_step(self, pred) -> list[float]:
        return [round(sum(e["dur"] for e in self.main if pred(e) and self.in_step(e, s)) / 1000, 1)
                for s in self.steps]

    def ancestors(self, ev, pred):
        """Main-thread events matching pred that contain ev (by interval), outermost first."""
        end = ev["ts"] + ev.get("dur", 0)
        return [a for a in self.main if pred(a) and a is not ev and a["ts"] <= ev["ts"]
                and a["ts"] + a["dur"] >= end]


def c10d(name):
    return lambda e: e.get("cat") == "cpu_op" and e["name"] == name


def check_run(folder: Path) -> tuple[str, bool]:
    ranks = {}
    for f in sorted(folder.glob("rank*.json.gz")):
        t = RankTrace(load(f), int(f.name[4:].split(".")[0]))
        ranks[t.rank] = t
    r0 = ranks[min(ranks)]
    name = folder.name
    steps = [s["name"] for s in r0.steps]
    lines = [f"{name}: ranks {sorted(ranks)}, steps {steps}"]
    ok = True

    ag_names = {"c10d::allgather_", "c10d::_allgather_base_"}
    is_ag = lambda e: e.get("cat") == "cpu_op" and e["name"] in ag_names  # noqa: E731
    backward = lambda e: e["name"] == "<built-in method run_backward of torch._C._EngineBase object at"  # noqa
    if name.startswith("fsdp1"):
        fsdp_ann = lambda a: a.get("cat") == "user_annotation" and a["name"].startswith("FullyShardedDataParallel._")  # noqa
        reasons = Counter()
        for e in r0.main:
            if is_ag(e):
                anc = r0.ancestors(e, fsdp_ann)
                reasons[anc[-1]["name"].split(".")[-1] if anc else "?"] += 1
        n = len(r0.steps)
        lines.append("  all-gathers by innermost FSDP1 annotation, per step: "
                     + ", ".join(f"{k} {v / n:g}" for k, v in sorted(reasons.items())))
        pre, post = reasons["_pre_backward_prefetch"] / n, reasons["_post_backward_prefetch"] / n
        want = {"fsdp1_backward_pre": (pre > 0 and post == 0), "fsdp1_forward_prefetch": pre > 0 and reasons["_pre_forward_prefetch"] > 0,
                "fsdp1_backward_post": post > 0 and pre == 0, "fsdp1_no_backward_prefetch": pre == 0 and post == 0}
        ok &= want.get(name, True)
    if name.startswith("fsdp2"):
        ann = lambda a: a.get("cat") == "user_annotation" and a["name"].startswith("FSDP::")  # noqa
        pf = lambda a: ann(a) and a["name"].startswith("FSDP::backward_prefetch for")  # noqa
        n = len(r0.steps)
        bwd_pf = sum(1 for e in r0.main if is_ag(e) and r0.ancestors(e, pf))
        bwd_od = sum(1 for e in r0.main if is_ag(e) and not r0.ancestors(e, pf)
                     and any(a["name"].startswith("FSDP::pre_backward") for a in r0.ancestors(e, ann)))
        n_pf_ann = sum(1 for e in r0.main if pf(e))
        lines.append(f"  backward all-gathers per step: prefetched {bwd_pf / n:g}, on-demand {bwd_od / n:g}; "
                     f"'FSDP::backward_prefetch for' annotations {n_pf_ann / n:g}")
        ok &= (bwd_pf == 0) if name == "fsdp2_no_backward_prefetch" else (bwd_pf > 0 and bwd_od == 0)
    scenario = (json.loads((folder / "manifest.json").read_text()).get("scenario") or {}).get("name") or name
    if scenario.startswith(("hf_", "cnn_")):
        text, user_ok = check_user_job(folder, ranks)
        lines.append(text)
        ok &= user_ok
    elif not name.startswith("fsdp"):  # train.py scenarios, by folder name
        for r, t in sorted(ranks.items()):
            ar = t.per_step(c10d("c10d::allreduce_"))
            mul = t.per_step(c10d("torch::distributed::reducer::mul_out"))
            fwd = t.per_step(lambda e: e["name"] == "DistributedDataParallel.forward")
            unused = t.per_step(c10d("torch.distributed.ddp.reducer::search_unused_parameters"))
            dl = t.ms_per_step(lambda e: e.get("cat") == "user_annotation"
                               and e["name"].startswith("enumerate(DataLoader)#"))
            sleep = t.ms_per_step(lambda e: e["name"] == "<built-in function sleep>")
            item = t.per_step(c10d("aten::item"))
            opt_item = [sum(1 for e in t.main if c10d("aten::item")(e) and t.in_step(e, s) and t.ancestors(
                e, lambda a: a["name"].startswith("Optimizer.step#"))) for s in t.steps]
            step_ms = [round(s["dur"] / 1000) for s in t.steps]
            lines.append(f"  rank{r}: step ms {step_ms}; allreduce/step {ar}; DDP.forward {fwd}; mul_out {mul}; "
                         f"search_unused {unused}; DataLoader ms {dl}; sleep ms {sleep}; "
                         f"aten::item {item} (in Optimizer.step {opt_item})")
        t0 = r0
        ar = t0.per_step(c10d("c10d::allreduce_"))
        # .item() called from the training script itself (AdamW on CPU calls item once per
        # parameter in Optimizer.step; DDP find_unused_parameters once per parameter in backward)
        item_out = [sum(1 for e in t0.main if c10d("aten::item")(e) and t0.in_step(e, s) and t0.ancestors(
            e, lambda a: a.get("cat") == "python_function" and "train.py(" in a["name"])
            and not t0.ancestors(e, lambda a: a["name"].startswith(("Optimizer.step#", "<built-in method run_backward"))))
            for s in t0.steps]
        lines.append(f"  rank0 aten::item called from train.py itself per step: {item_out}")
        dl = t0.ms_per_step(lambda e: e.get("cat") == "user_annotation" and e["name"].startswith("enumerate(DataLoader)#"))
        checks = {
            "ddp_one_bucket": all(a == 1 for a in ar),
            "ddp_tiny_buckets": all(a >= 10 for a in ar),
            "ddp_default": all(a == 2 for a in ar),
            "ddp_find_unused": all(a == 3 for a in ar),
            "dataloader_slow": all(d >= 20 for d in dl),
            "dataloader_fixed": all(d < 20 for d in dl),
            "host_sync": all(i > 0 for i in item_out),
            "grad_accum_sync_every": all(a >= 8 for a in ar),
            "grad_accum_no_sync": all(a == 2 for a in ar),
        }
        ok &= checks.get(name, True)
        if name != "host_sync":
            ok &= all(i == 0 for i in item_out)
        if name == "straggler" and 1 in ranks:
            s1 = ranks[1].ms_per_step(lambda e: e["name"] == "<built-in function sleep>")
            ok &= all(s >= 250 for s in s1)
            # clock-comparable (same host): per step, issue time of the first c10d op on each rank
            leads = []
            for s0, s1_ in zip(ranks[0].steps, ranks[1].steps):
                f0 = next(e for e in ranks[0].main if e["name"].startswith("c10d::") and ranks[0].in_step(e, s0))
                f1 = next(e for e in ranks[1].main if e["name"].startswith("c10d::") and ranks[1].in_step(e, s1_))
                leads.append(round((f1["ts"] - f0["ts"]) / 1000))
            lines.append(f"  first-collective issue time rank1 - rank0 per step (ms): {leads}")
            gloo = {r: t.per_step(lambda e: False) for r, t in ranks.items()}
            del gloo
    lines.append("  OK" if ok else "  MISSING SIGNATURE")
    return "\n".join(lines), ok


COLLECTIVE_PREFIXES = ("c10d::", "gloo:", "nccl:", "record_param_comms")


def frame_ms(t: RankTrace, func: str) -> list[float]:
    """Per step, ms inside Python frames of the function named ``func``."""
    return t.ms_per_step(lambda e: e.get("cat") == "python_function" and e["name"].endswith(f": {func}"))


def check_user_job(folder: Path, ranks: dict) -> tuple[str, bool]:
    """Signatures of the user-style jobs (hf_decoder.py, cnn.py), from the raw events."""
    manifest = json.loads((folder / "manifest.json").read_text())
    params = manifest["scenario"]["params"]
    lines, ok = [], True
    ok &= sorted(ranks) == list(range(manifest["world_size"]))
    for r, t in sorted(ranks.items()):
        comm = sum(1 for e in t.all if e["name"].startswith(COLLECTIVE_PREFIXES))
        step_ms = [round(s["dur"] / 1000, 1) for s in t.steps]
        lines.append(f"  rank{r}: step ms {step_ms}; communication events {comm}; "
                     f"distributedInfo backend {t.dist.get('backend') if t.dist else None}")
        if params["launch"] in ("accelerate_default", "no_process_group"):
            ok &= comm == 0  # the ranks never communicate
        else:
            ok &= comm > 0
    # activation checkpointing: the model's own forward code runs again inside backward (the recompute)
    recompute = {}
    for r, t in sorted(ranks.items()):
        bwd = [e for e in t.main if e["name"].startswith("<built-in method run_backward")]
        recompute[r] = sum(1 for e in t.all if e.get("cat") == "python_function"
                           and e["name"].endswith(": forward") and ("modeling_qwen2.py(" in e["name"]
                                                                    or "cnn.py(" in e["name"])
                           and any(b["ts"] <= e["ts"] < b["ts"] + b["dur"] for b in bwd)) / max(len(t.steps), 1)
    lines.append(f"  model forward frames inside backward per step (recompute): {recompute}")
    ok &= all(v > 0 for v in recompute.values()) if params.get("act_ckpt", "none") != "none" else \
        all(v == 0 for v in recompute.values())
    if params.get("item_sleep_ms"):
        dl = {r: t.ms_per_step(lambda e: e.get("cat") == "user_annotation"
                               and e["name"].startswith("enumerate(DataLoader)#")) for r, t in ranks.items()}
        lines.append(f"  DataLoader ms per step: {dl}")
        # num_workers=0: each batch of 8 samples sleeps 8 x item_sleep_ms in the main process
        ok &= all(d >= 0.75 * 8 * params["item_sleep_ms"] for v in dl.values() for d in v)
    kind = params.get("straggler", "none")
    if kind != "none":
        func = {"sleep": "straggler_sleep", "matmul": "straggler_extra_matmul"}[kind]
        slow = params["slow_rank"]
        for r, t in sorted(ranks.items()):
            extra = frame_ms(t, func)
            shares = [round(x / (s["dur"] / 1000), 3) for x, s in zip(extra, t.steps)]
            lines.append(f"  rank{r}: {func} ms per step {extra}; share of the step {shares}")
            if r == slow:
                # the injected share of the step, within a band around the target (shared-core noise)
                ok &= all(0.15 <= x <= 0.5 for x in shares)
            else:
                ok &= all(x == 0 for x in extra)
        # clock-comparable (same host): per step, when each rank issues its first collective
        leads = []
        for steps in zip(*(ranks[r].steps for r in sorted(ranks))):
            firsts = []
            for r, s in zip(sorted(ranks), steps):
                t = ranks[r]
                first = next((e for e in t.main if e["name"].startswith("c10d::") and t.in_step(e, s)), None)
                firsts.append(None if first is None else first["ts"])
            if None not in firsts:
                leads.append(round((firsts[slow] - min(firsts)) / 1000, 1))
        lines.append(f"  slow rank's first collective issued after the other's, per step (ms): {leads}")
        ok &= len(leads) > 0 and all(x > 0 for x in leads)
    return "\n".join(lines), ok


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "traces")
    all_ok = True
    for folder in sorted(p for p in root.iterdir() if (p / "manifest.json").is_file()):
        text, ok = check_run(folder)
        print(text, flush=True)
        all_ok &= ok
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
