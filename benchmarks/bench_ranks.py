"""Many ranks from summaries: CPU and peak memory of ``analyze --json`` over 1,024 / 4,096 / 16,384 ranks.

The ranks are copies of one real rank's summary (default: the public V100 trace
``traces-public/v100_trace_diff_test``, 64 collectives in 6 steps, summarised once by
``fsdpdoctor summarize``); each copy gets its rank, the world size, a host (8 ranks per host, so
the clocks are estimated, not assumed shared), its own clock offset (up to +-2 ms) with a little
per-call jitter (a few microseconds on every collective's end), and one rank in the middle issues
every collective late (by half its duration, at most 3 ms) (a straggler the reduce has to find). The copies are written as a folder
of summaries alone, the input a cluster that summarised its ranks in the job hands over.

Every measurement is a fresh ``python -m fsdpdoctor analyze DIR --json`` (default document) timed
by ``os.wait4`` (CPU of the child and the workers it reaped) with the peak RSS of the process tree
sampled every 100 ms from /proc; the one-minute load average is printed beside each row. The
document's size is reported too.

    python benchmarks/bench_ranks.py                          # 1024 4096 16384
    python benchmarks/bench_ranks.py --ranks 256 1024 --json /tmp/ranks.json
    python benchmarks/bench_ranks.py --dask                   # and 16,384 again on a loopback Dask cluster

The default document keeps the per-rank detail of the ranks the findings name only, past a few MB
of it (report/json_report.py); ``--extra=--ranks=all`` measures the whole document instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.bench_growth import measure  # noqa: E402

SHARED = Path(os.environ.get("FSDPDOCTOR_SHARED") or REPO.parent / "shared")
DEFAULT_TRACE = SHARED / "traces-public" / "v100_trace_diff_test" / "test.json.gz"
STRAGGLER_LATE_US = 3000.0


def real_summary(trace: Path, tmp: Path) -> dict:
    """The summary of one real rank, as plain msgpack values."""
    out = tmp / "src"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", "fsdpdoctor", "summarize", str(trace), "-q", "--out", str(out)],
                   check=True, env=env, cwd=REPO)
    from fsdpdoctor.analysis import rankresult
    r = rankresult.read_file(next(out.glob("*" + rankresult.SUMMARY_SUFFIX)))
    return msgspec.msgpack.decode(rankresult.encode(r))


def _shift(d: dict, keys: tuple[str, ...], by: float) -> None:
    for k in keys:
        if d.get(k) is not None:
            d[k] += by


def make_ranks(src: dict, dst: Path, n: int, seed: int = 1) -> int:
    """``n`` summaries of ``src`` in ``dst``; returns the collectives per rank."""
    from fsdpdoctor.analysis import rankresult
    rng = random.Random(seed)
    dst.mkdir(parents=True, exist_ok=True)
    late = n // 2
    for r in range(n):
        d = msgspec.msgpack.decode(msgspec.msgpack.encode(src))   # a deep copy
        off = rng.uniform(-2000.0, 2000.0)                     # this rank's clock against rank 0's
        d["rank"], d["world_size"], d["host"] = r, n, f"node{r // 8}"
        d["summary"]["rank"], d["summary"]["host"], d["summary"]["file"] = r, f"node{r // 8}", f"rank{r}.json.gz"
        for c in d["collectives"]:
            c["rank"] = r
            _shift(c, ("start_us", "end_us", "issue_us"), off)
            c["end_us"] += rng.uniform(0.0, 5.0)
            if r == late:   # arrives late: starts later, ends with the others (who waited for it)
                late_by = min(STRAGGLER_LATE_US, 0.5 * (c["end_us"] - c["start_us"]))
                c["start_us"] += late_by
                if c.get("issue_us") is not None:
                    c["issue_us"] += late_by
        for s in d["summary"]["steps"]:
            s["rank"] = r
        for key in ("host_syncs", "dataloader", "setup", "gpu_idle", "recompute", "offload", "quality"):
            rows = d.get(key)
            for row in rows if isinstance(rows, list) else [rows]:
                if isinstance(row, dict) and "rank" in row:
                    row["rank"] = r   # each rank's own rows (a finding names the rank it read them from)
        if d["summary"].get("mean"):
            d["summary"]["mean"]["rank"] = r
        ident = d.get("identity")
        if ident:
            ident["host"] = f"node{r // 8}"
            ident["digest"] = f"{r:032x}"
            if ident.get("window_us"):
                ident["window_us"] = [ident["window_us"][0] + off, ident["window_us"][1] + off]
        for st in d.get("files") or []:
            st["path"] = f"rank{r}.json.gz"
        res = msgspec.msgpack.decode(msgspec.msgpack.encode(d), type=rankresult.RankResult)
        (dst / f"rank{r}{rankresult.SUMMARY_SUFFIX}").write_bytes(rankresult.pack(res))
    return len(src["collectives"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[1024, 4096, 16384])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the real rank trace to summarise and copy")
    ap.add_argument("--keep", type=Path, help="write the folders and documents here and keep them")
    ap.add_argument("--extra", nargs="*", default=[], help="more analyze arguments (e.g. --ranks-detail ...)")
    ap.add_argument("--dask", action="store_true",
                    help="also run the largest count on a loopback Dask cluster (--dask local) and compare findings")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if not args.trace.is_file():
        print(f"{args.trace} not found; pass --trace", file=sys.stderr)
        return 2
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="fsdpdoctor-ranks-"))
    tmp.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        shutil.rmtree(tmp / "src", ignore_errors=True)
        src = real_summary(args.trace, tmp)
        for n in args.ranks:
            folder = tmp / f"r{n}"
            shutil.rmtree(folder, ignore_errors=True)
            per = make_ranks(src, folder, n)
            row = {"ranks": n, "collectives_per_rank": per,
                   "mb_summaries": sum(f.stat().st_size for f in folder.iterdir()) / 1e6}
            row.update(measure([sys.executable, "-m", "fsdpdoctor", "analyze", str(folder), "--json", *args.extra],
                               tmp / f"r{n}.json"))
            rows.append(row)
            print(_line(row), flush=True)
            if args.dask and n == max(args.ranks) and "cpu_s" in row:
                rows.append(dask_row(folder, n, per, tmp, args.extra))
                print(_line(rows[-1]), flush=True)
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    ok = [r for r in rows if "cpu_s" in r and not r.get("engine")]
    for a, b in zip(ok, ok[1:]):
        print(f"CPU({b['ranks']})/CPU({a['ranks']}) = {b['cpu_s'] / a['cpu_s']:.2f} "
              f"for {b['ranks'] / a['ranks']:.0f}x the ranks")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def dask_row(folder: Path, n: int, per: int, tmp: Path, extra: list[str]) -> dict:
    """The same analysis with the summaries read by a loopback Dask cluster (a LocalCluster of this
    machine's cores, started and closed by the child, so its workers' CPU is in the child's): whether
    its findings, and its whole document, are the ones of the run without Dask."""
    row = {"ranks": n, "collectives_per_rank": per, "engine": "dask local"}
    row.update(measure([sys.executable, "-m", "fsdpdoctor", "analyze", str(folder), "--json", "--dask", "local",
                        *extra], tmp / f"r{n}-dask.json"))
    if "cpu_s" in row:
        plain = json.loads((tmp / f"r{n}.json").read_bytes())
        dask = json.loads((tmp / f"r{n}-dask.json").read_bytes())
        row["same_findings"] = plain["findings"] == dask["findings"]
        row["same_document"] = plain == dask
    return row


def _line(row: dict) -> str:
    if "error" in row:
        return f"{row['ranks']:6d} ranks: {row['error']}"
    if row.get("engine"):
        return (f"{row['ranks']:6d} ranks on {row['engine']}: {row['cpu_s']:6.1f} s CPU {row['wall_s']:6.1f} s wall "
                f"{row['peak_tree_mib']:6.0f} MiB peak (load {row['load']:.1f}); findings "
                f"{'the same' if row['same_findings'] else 'DIFFERENT'}, document "
                f"{'identical' if row['same_document'] else 'different'}")
    return (f"{row['ranks']:6d} ranks x {row['collectives_per_rank']} collectives ({row['mb_summaries']:.0f} MB of "
            f"summaries): {row['cpu_s']:6.1f} s CPU {row['wall_s']:6.1f} s wall {row['peak_tree_mib']:6.0f} MiB peak, "
            f"document {row['doc_mb']:.1f} MB (load {row['load']:.1f})")


if __name__ == "__main__":
    sys.exit(main())
