"""The hanging reference scenarios, in one table (no torch import).

Each: ``injects`` (one line), ``expected`` (the verdict ``fsdpdoctor hang`` must give on its
dumps: ``cause``, the ``lagging`` ranks, the process group ``group`` and ``op`` of the
collective where the ranks diverge, the user ``function`` the lagging rank is in), and
``ends`` ("hang": the launcher kills the job after the dumps; "abort": gloo ends it itself).
The job is ``hang_job.py``: a tiny DDP model on 2 CPU ranks (gloo) whose loop also all-reduces
a metric on a second process group (``metrics``); the fault is injected at ``HANG_STEP``.
"""

from __future__ import annotations

HANG_STEP = 6          # the step the fault happens at (steps 0..5 complete)
HANG_TIMEOUT_S = 3.0   # watchdog timeout of the recorded runs
GLOO_TIMEOUT_S = 60.0  # longer than the watchdog (+ launcher) needs: the dump comes first

HANG_SCENARIOS: dict[str, dict] = {
    "hang_loader": dict(
        injects="rank 1's data loader blocks forever at step 6 (and slows down before it)",
        ends="hang",
        expected=dict(cause="data-loader", lagging=[1], group="default_pg", op="all_reduce",
                      function="read_shard", silent=[])),
    "hang_skip_collective": dict(
        injects="rank 1 skips the metrics all-reduce (second process group) at step 6",
        ends="hang",
        expected=dict(cause="skipped-collective", lagging=[1], group="metrics", op="all_reduce",
                      function="log_metrics", silent=[])),
    "hang_skip_collective_default": dict(
        injects="rank 1 skips the metrics all-reduce on the default group at step 6 (gloo aborts)",
        ends="abort",
        # rank 0 aborts in gloo's size check before any watchdog fires: it leaves only its
        # faulthandler stacks, so nothing tells which of the two ranks is the wrong one: both are named
        expected=dict(cause="desync", lagging=[0, 1], group="default_pg", op="all_reduce",
                      function="log_metrics", silent=[]),
        # rank 1 gets the broken connection as an exception and its watchdog dumps it; when the
        # launcher, seeing rank 0 dead, stops rank 1 (SIGTERM) before that dump is written (under load, of
        # 136 recorded runs: 10 while it wrote it, 1 still in its backward), rank 1's collective is lost
        # with it: all the evidence says is rank 0's abort
        cut_short=dict(cause="aborted", lagging=[0], group=None, op=None, function="log_metrics", silent=[])),
    "hang_collective_order": dict(
        injects="at step 6 rank 1 all-reduces the metrics group before the stats group, rank 0 after",
        ends="hang",
        expected=dict(cause="collective-order", lagging=[0, 1], group="metrics", op="all_reduce",
                      function="log_metrics", silent=[])),
    "hang_rank_raises": dict(
        injects="rank 1 raises an exception in its step 6 (a bad batch): it exits, torchrun ends rank 0",
        ends="abort",
        expected=dict(cause="crashed", lagging=[1], group=None, op=None, function="check_batch", silent=[])),
    "hang_dead_rank": dict(
        injects="rank 1 is frozen by the kernel at step 6 (SIGSTOP: as a dead or hard-stuck peer looks to NCCL)",
        ends="hang",
        expected=dict(cause="no-dump", lagging=[1], group="default_pg", op="all_reduce",
                      function=None, silent=[1])),
    "hang_killed_rank": dict(
        injects="rank 1 is killed (SIGKILL, as the OOM killer does) at step 6: no handler runs, it leaves "
                "only its watchdog file's header; torchrun ends rank 0",
        ends="abort",
        # rank 0 dumps (a peer reset its connection) or gets torchrun's SIGTERM first: either way the
        # verdict is rank 1, but which collective rank 0 was in is known only in the first case
        expected=dict(cause="no-dump", lagging=[1], group=None, op=None, function=None, silent=[1]),
        cut_short=dict(cause="no-dump", lagging=[1], group=None, op=None, function=None, silent=[1])),
}


def expected(name: str) -> dict:
    """What a recorded hang scenario must show (expectations.py): no diagnosis-rule expectations (the profiled
    steps before the fault are healthy but for hang_loader's slowing rank), the hang verdict."""
    sc = HANG_SCENARIOS[name]
    return {"scenario": name, "injects": sc["injects"], "must": [], "must_not": [], "hang": sc["expected"]}
