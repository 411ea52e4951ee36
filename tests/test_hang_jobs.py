"""Real 2-rank torchrun jobs that hang: the watchdog dumps, the launcher ends the job, and
`fsdpdoctor hang` names the right rank, the collective and the frame, for every scenario of
reference_jobs/hang_scenarios.py (about 15-20 s each, mostly torch start-up)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import requires_torch
from fsdpdoctor.cli import main

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "reference_jobs"))

from hang_scenarios import HANG_SCENARIOS  # noqa: E402
from test_hang import check_verdict  # noqa: E402

pytestmark = [requires_torch, pytest.mark.slow]


@pytest.mark.parametrize("scenario", sorted(HANG_SCENARIOS))
def test_hanging_job(scenario, tmp_path, capsys):
    from record_hangs import _dumped, run_hang

    exp = HANG_SCENARIOS[scenario]["expected"]
    out = tmp_path / scenario
    want = {0, 1} - set(exp["silent"])
    # a gloo job occasionally fails at start-up on a loaded machine (a rank writes nothing at all):
    # run it again. A rank the launcher stopped while its watchdog was writing leaves its stacks, so
    # it has dumped: the verdict is then judged on that evidence below, not run until it is complete
    for _attempt in range(3):
        res = run_hang(scenario, out, hang_timeout_s=3.0, deadline_s=150)
        if (out / "hang").is_dir() and _dumped(out) >= want:
            break
    assert (out / "hang").is_dir(), res["stderr"][-3000:]
    if HANG_SCENARIOS[scenario]["ends"] == "hang":
        assert res["killed"], "a hanging job ended by itself"
    assert main(["hang", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [r for r in doc["silent"] if r not in exp["silent"]], doc["silent"]

    from fsdpdoctor.commands.hang import build_report

    rep = build_report(str(out))
    cut = cut_short(out)
    if cut:
        # the launcher stopped a rank before its watchdog had written its dump (or while it did): the
        # verdict is judged on the evidence that is left, and the report says what was lost
        assert "cut_short" in HANG_SCENARIOS[scenario], f"rank(s) {cut} stopped before their dump"
        exp = HANG_SCENARIOS[scenario]["cut_short"]
        for r in cut:
            assert rep.ranks[r].trigger == "sigterm" and "SIGTERM" in (rep.ranks[r].note or ""), rep.ranks[r]
            assert any(f"rank {r}: stopped by the launcher" in e for e in rep.verdicts[0].evidence), rep.verdicts[0]
    check_verdict(rep, exp)
    # the frame is the job's own source file, with its line
    if exp["function"]:
        assert rep.verdicts[0].frame.file.endswith("hang_job.py")
    if scenario == "hang_loader":
        assert rep.trend is not None and rep.trend.lagging_was_straggler


def cut_short(out: Path) -> list[int]:
    """Ranks with no JSON dump that left only the stacks SIGTERM writes: the launcher stopped them
    before their watchdog had dumped their flight recorder (or while it was writing it)."""
    cut = []
    for fh in sorted((out / "hang").glob("rank*.faulthandler.txt")):
        rank = int(fh.name[4:].split(".")[0])
        text = fh.read_text(errors="replace")
        if not (out / "hang" / f"rank{rank}.json").exists() and "Fatal Python error" not in text \
                and "Timeout (" not in text and "\n" in text.strip():
            cut.append(rank)
    return cut


JOB = '''
import datetime, sys
from fsdpdoctor.capture import watch

MODE, OUT = sys.argv[1], sys.argv[2]
w = watch(OUT, timeout_s=3).start()  # before init_process_group: it turns the flight recorder on
import torch, torch.distributed as dist, torch.nn as nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 16))
for m in model:
    fully_shard(m)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def spin_until_converged():
    y = 0
    while True:
        y += 1


def save_checkpoint():
    if rank == 0:
        dist.barrier()  # only rank 0 waits


for step in range(20):
    if MODE == "spin" and rank == 1 and step == 5:
        spin_until_converged()
    if MODE == "barrier" and step == 5:
        save_checkpoint()
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    w.step()
w.close()
dist.destroy_process_group()
'''


@pytest.mark.parametrize("mode,cause,ranks,function", [
    ("spin", "busy-loop", [1], "spin_until_converged"),
    ("barrier", "desync", [0], "save_checkpoint"),
])
def test_fsdp2_job_with_standalone_watch(mode, cause, ranks, function, tmp_path):
    """A job unlike the reference one: FSDP2, the standalone watch() started before the process
    group, a one-line infinite loop on one rank / a barrier only rank 0 calls."""
    import os
    import subprocess
    import time

    from record_hangs import _kill_tree, free_port

    from fsdpdoctor.commands.hang import build_report

    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = tmp_path / "run"

    def stalled() -> set[int]:  # dumps of the stall at step 5 (a slow start-up may dump earlier)
        got = set()
        for r in (0, 1):
            try:
                if json.loads((out / "hang" / f"rank{r}.json").read_text())["last_step"] >= 5:
                    got.add(r)
            except (OSError, ValueError, KeyError):
                pass
        return got

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(free_port()), str(script), mode, str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    t0 = time.time()
    try:
        while proc.poll() is None and time.time() - t0 < 150 and stalled() != {0, 1}:
            time.sleep(0.3)
        time.sleep(0.5)
    finally:
        _kill_tree(proc.pid)
        err = proc.communicate()[1].decode(errors="replace")
    assert stalled() == {0, 1}, err[-3000:]
    rep = build_report(str(out))
    v = rep.verdicts[0]
    assert (v.cause, v.ranks, v.frame.function) == (cause, ranks, function), v.summary
