"""A public corpus of Kineto/Chrome traces that nobody here recorded, analysed through the CLI.

    python benchmarks/corpus.py fetch --from MIRRORS_DIR   # git mirrors/clones named owner+name
    python benchmarks/corpus.py fetch                      # or: a plain `git clone` of each repository
    python benchmarks/corpus.py run [--only ID ...]        # analyse all, check invariants, write docs/corpus.md

``benchmarks/corpus.toml`` lists every trace: repository, commit, path, licence, sha256 and what the
source says it is (a file inside a tarball the repository holds is named by ``member``; its sha256 is
the member's). ``fetch`` puts the files into a cache outside the repository
(``$FSDPDOCTOR_CORPUS``, default ``~/.cache/fsdpdoctor-corpus``), one folder per trace, each file
verified against its sha256; nothing of the traces is ever committed. ``run`` analyses every cached
trace with ``fsdpdoctor analyze --json``, checks the invariants of the result (the project's own
checker, ``fsdpdoctor.analysis.invariants``: what it had to bound before rendering and what it still
finds; and, independently of it, shares in [0, 1], the parts adding up to the step, each finding's
impact at most its step, the root findings together at most the step) and compares the verdict with what the source says (``contradicts``: findings the
source rules out; ``expects``: what it shows; kind ``not-kineto``: another tool's file in Chrome's event
format, which is rightly refused). The report is ``docs/corpus.md``; the raw results go
to ``results.json`` in the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's fsdpdoctor, as the analyses below run it
LIST = ROOT / "benchmarks" / "corpus.toml"
REPORT = ROOT / "docs" / "corpus.md"
# a part of a step, a share or an impact may exceed its bound by rounding only (µs figures summed)
EPS = 1e-3
PARTS = ("compute_us", "optimizer_us", "exposed_comm_us", "data_loading_us", "idle_us")
SEVERITY = {"info": 0, "warning": 1, "error": 2}
# findings about a training configuration: the source contradicts them on an inference trace
TRAINING_ONLY = ("ddp-", "fsdp", "grad-accum", "optimizer")
# the kind of a file that holds no torch.profiler recording (another tool's trace in Chrome's format):
# a refusal in one line is the right answer, a finding at warning or above is not
NOT_A_RECORDING = "not-kineto"


@dataclass
class TraceFile:
    path: str
    sha256: str
    # a file inside the archive at ``path`` (a .tar.gz the repository holds); sha256 is then the member's
    member: str = ""

    @property
    def name(self) -> str:
        """The file's name in the cache."""
        return Path(self.member or self.path).name


@dataclass
class Trace:
    id: str
    repo: str
    commit: str
    licence: str
    says: str
    kind: list[str]
    files: list[TraceFile]
    contradicts: list[str] = field(default_factory=list)
    expects: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repo}/blob/{self.commit}/{self.files[0].path}"


def cache_dir() -> Path:
    return Path(os.environ.get("FSDPDOCTOR_CORPUS") or Path.home() / ".cache" / "fsdpdoctor-corpus")


def load_list(path: Path = LIST) -> list[Trace]:
    doc = tomllib.loads(path.read_text())
    out = []
    for t in doc["trace"]:
        files = [TraceFile(**f) for f in t.pop("files")]
        out.append(Trace(files=files, **t))
    return out


def trace_input(t: Trace, root: Path | None = None) -> Path:
    """What `analyze` is given: the file of a one-file trace, the folder of a multi-file one."""
    d = (root or cache_dir()) / t.id
    return d / t.files[0].name if len(t.files) == 1 else d


def is_cached(t: Trace, root: Path | None = None) -> bool:
    d = (root or cache_dir()) / t.id
    return all((d / f.name).is_file() for f in t.files)


# ------------------------------------------------------------------------------------------ fetch
def _git_dir(mirrors: Path | None, repo: str, clones: Path) -> Path:
    """A git directory holding ``repo``: a mirror under MIRRORS_DIR, else a blob-less clone of GitHub's."""
    name = repo.replace("/", "+")
    if mirrors is not None:
        for cand in (mirrors / name / "repo", mirrors / name, mirrors / repo, mirrors / name / ".git"):
            if (cand / "objects").is_dir() or (cand / "HEAD").is_file():
                return cand
        raise SystemExit(f"corpus: no mirror of {repo} under {mirrors}")
    dest = clones / name
    if not dest.exists():
        subprocess.run(["git", "clone", "--quiet", "--bare", "--filter=blob:none",
                        f"https://github.com/{repo}.git", str(dest)], check=True)
    return dest


def _member(archive: bytes, member: str) -> bytes | None:
    """One file of a tar archive (compressed or not), or None where it holds no such file."""
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            got = tar.extractfile(member)
            return got.read() if got is not None else None
    except (tarfile.TarError, KeyError):
        return None


def fetch(mirrors: Path | None) -> int:
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    bad = done = have = 0
    for t in load_list():
        d = root / t.id
        for f in t.files:
            target = d / f.name
            if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == f.sha256:
                have += 1
                continue
            git = _git_dir(mirrors, t.repo, root / "_git")
            r = subprocess.run(["git", f"--git-dir={git}", "show", f"{t.commit}:{f.path}"], capture_output=True)
            if r.returncode != 0:
                print(f"corpus: {t.id}: {f.path} not readable at {t.commit[:10]}: "
                      f"{r.stderr.decode(errors='replace').strip()[:120]}", file=sys.stderr)
                bad += 1
                continue
            data = _member(r.stdout, f.member) if f.member else r.stdout
            digest = hashlib.sha256(data).hexdigest() if data is not None else "(member absent)"
            if digest != f.sha256:
                print(f"corpus: {t.id}: {f.path}: sha256 {digest[:16]}..., expected {f.sha256[:16]}...",
                      file=sys.stderr)
                bad += 1
                continue
            d.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            done += 1
    print(f"corpus: {done} file(s) fetched, {have} already cached, {bad} failed -> {root}")
    return 1 if bad else 0


# ------------------------------------------------------------------------------------- invariants
def invariant_violations(doc: dict) -> list[str]:
    """What a result must never show, whatever the trace: a share outside [0, 1], parts that do not
    add up to their step, a finding claiming more than its step, roots claiming more than the step."""
    out = []
    for r in doc.get("ranks", []):
        for s in r.get("steps", []):
            dur = s.get("duration_us") or 0.0
            where = f"rank {r.get('rank')} step {s.get('step')}"
            if dur < 0:
                out.append(f"{where}: negative duration {dur}")
                continue
            parts = [s.get(p) or 0.0 for p in PARTS]
            for p, v in zip(PARTS, parts):
                if v < -EPS * max(dur, 1.0) or (dur and v > dur * (1 + EPS)):
                    out.append(f"{where}: {p} {v:.0f} us outside [0, step {dur:.0f} us]")
            if dur and abs(sum(parts) - dur) > EPS * dur + 1.0:
                out.append(f"{where}: parts add up to {sum(parts):.0f} us, step {dur:.0f} us")
    roots = 0.0
    for f in doc.get("findings", []):
        frac = f.get("impact_frac")
        if frac is not None and not (-EPS <= frac <= 1 + EPS):
            out.append(f"finding {f['id']}: impact {100 * frac:.1f} % of the step")
        if frac is not None and not f.get("caused_by"):
            roots += max(frac, 0.0)
    if roots > 1 + EPS:
        out.append(f"root findings together claim {100 * roots:.1f} % of the step")
    return out


def project_invariants(doc: dict, raw: bytes) -> list[str]:
    """The project's own checker (``fsdpdoctor.analysis.invariants``): what it had to bound or withhold
    before rendering (its notes), and what it still finds in the result as rendered."""
    from fsdpdoctor.analysis import invariants
    from fsdpdoctor.results import Analysis

    out = [n for n in doc.get("notes", []) if n.startswith("invariant ")]
    out += [str(v) for v in invariants.check(Analysis.from_json(raw))]
    return out


# ------------------------------------------------------------------------------------------- run
@dataclass
class Outcome:
    trace: Trace
    rc: int
    seconds: float
    error: str = ""
    steps: int = 0
    ranks: int = 0
    step_ms: float | None = None
    dialect: str = ""
    kind: str = "-"                     # the input kind fsdpdoctor gave it (job.input_kind)
    findings: list[dict] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool:
        refused_rightly = self.rc == 2 and NOT_A_RECORDING in self.trace.kind
        return not self.disagreements and not self.violations and (self.rc == 0 or refused_rightly)


def judge(t: Trace, doc: dict) -> list[str]:
    """Where our verdict and the source part ways (the source's word is what it says it is)."""
    out = []
    found = {f["id"]: f for f in doc.get("findings", [])}
    for fid in t.contradicts:
        f = found.get(fid)
        if f is not None and SEVERITY.get(f["severity"], 0) >= 1:
            out.append(f"{fid} at {f['severity']}, which the source rules out")
    if NOT_A_RECORDING in t.kind:
        for f in doc.get("findings", []):
            if SEVERITY.get(f["severity"], 0) >= 1:
                out.append(f"{f['id']} at {f['severity']} from a file that holds no profiler recording")
    if "inference" in t.kind:
        for f in doc.get("findings", []):
            if f["id"].startswith(TRAINING_ONLY) and SEVERITY.get(f["severity"], 0) >= 1:
                out.append(f"{f['id']} at {f['severity']} on an inference trace")
    for fid in t.expects:
        if fid not in found:
            out.append(f"missed {fid}, which the source shows")
    # a source that rules out "never communicate" describes communication: it must be counted as such
    if "ranks-never-communicate" in t.contradicts and not ((doc.get("mean") or {}).get("comm_us") or 0) > 0:
        out.append("no communication counted, which the source describes")
    n_steps = max((len(r.get("steps", [])) for r in doc.get("ranks", [])), default=0)
    if n_steps <= 1 and len(doc.get("ranks", [])) <= 1:
        for f in doc.get("findings", []):
            if f["severity"] == "error":
                out.append(f"{f['id']} at error from one step of one rank")
    return out + suspicious(doc)


# a step this many times the median of its rank's steps spans something other than work (a gap between
# two recordings joined as one step); a real step-to-step spread is a few times at most
SPAN_FACTOR = 100


def suspicious(doc: dict) -> list[str]:
    """What no source has to contradict to be wrong: a finding that claims the whole step (no fix saves
    the work itself), a step of zero length, a step that spans far more than the others."""
    out = []
    for f in doc.get("findings", []):
        frac = f.get("impact_frac") or 0.0
        if frac >= 0.99 and SEVERITY.get(f["severity"], 0) >= 1 and not f.get("caused_by"):
            out.append(f"suspicious: {f['id']} at {f['severity']} claims {100 * frac:.1f} % of the step")
    for r in doc.get("ranks", []):
        durs = [s.get("duration_us") or 0.0 for s in r.get("steps", [])]
        if len(durs) < 2:
            continue
        med = sorted(durs)[len(durs) // 2]
        # a step under 1 % of the median holds no work: a marker, not a step to count as evidence
        zero = sum(1 for d in durs if d <= 0.01 * med)
        if zero:
            out.append(f"suspicious: rank {r.get('rank')} has {zero} step(s) of (near) zero length, "
                       "under 1 % of its median step")
        if med > 0 and max(durs) > SPAN_FACTOR * med:
            out.append(f"suspicious: rank {r.get('rank')} has a step of {max(durs) / 1e3:.0f} ms, "
                       f"{max(durs) / med:.0f}x its median step")
    return out


def run_one(t: Trace, root: Path, out_dir: Path) -> Outcome:
    doc_path = out_dir / f"{t.id}.json"
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", str(trace_input(t, root)), "--json",
                        "--no-progress"], capture_output=True, cwd=ROOT, timeout=900,
                       env=os.environ | {"PYTHONPATH": str(ROOT)})
    o = Outcome(trace=t, rc=p.returncode, seconds=time.monotonic() - start)
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip().splitlines()
        # the report names the cache as <cache>: no path of this machine goes into the repository
        o.error = (err[-1] if err else f"exit {p.returncode}").replace(str(root), "<cache>")
        if p.returncode != 2 or len(err) != 1:
            o.violations.append(f"exit {p.returncode} with {len(err)} stderr line(s): not one clear line")
        elif NOT_A_RECORDING not in t.kind:
            o.disagreements.append("refused a trace the source describes as a valid recording")
        return o
    doc_path.write_bytes(p.stdout)
    doc = json.loads(p.stdout)
    o.ranks = len(doc.get("ranks", []))
    o.steps = max((len(r.get("steps", [])) for r in doc.get("ranks", [])), default=0)
    mean = (doc.get("mean") or {}).get("duration_us")
    o.step_ms = mean / 1e3 if mean else None
    o.dialect = (doc.get("job") or {}).get("dialect") or ""
    o.kind = _kind(doc)
    o.findings = sorted(doc.get("findings", []), key=lambda f: (-SEVERITY.get(f["severity"], 0),
                                                                 -(f.get("impact_frac") or 0)))
    o.violations = invariant_violations(doc)
    o.violations += [f"project checker: {v}" for v in project_invariants(doc, p.stdout)]
    o.disagreements = judge(t, doc)
    if ((doc.get("job") or {}).get("input_kind") or {}).get("device") == "none":
        o.violations += device_activity(trace_input(t, root))
    return o


# device work in a file, read on its own (not through fsdpdoctor): a device event's category, or a
# runtime call that launches work; a trace classified as host-only must hold none of them
_DEVICE_CAT = ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
_LAUNCHES = ("LaunchKernel", "GraphLaunch", "Memcpy", "Memset")


def device_activity(path: Path) -> list[str]:
    """What device activity a trace classified as host-only (input kind device "none") holds."""
    import gzip
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    out = []
    for f in files:
        raw = f.read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
        dev = sum(1 for e in events if isinstance(e, dict) and str(e.get("cat", "")).lower() in _DEVICE_CAT)
        launches = sum(1 for e in events if isinstance(e, dict) and any(k in str(e.get("name", "")) for k in _LAUNCHES)
                       and str(e.get("cat", "")).lower() in ("cuda_runtime", "runtime", "cuda_driver"))
        # events on a process an accelerator's profiler names as its device (torch_npu: "Ascend Hardware",
        # label "NPU"), whatever their category
        named = {e.get("pid") for e in events if isinstance(e, dict) and e.get("ph") == "M"
                 and e.get("name") in ("process_name", "process_labels") and isinstance(e.get("args"), dict)
                 and _DEVICE_PROCESS.search(str(e["args"].get("name", e["args"].get("labels", ""))))}
        dev += sum(1 for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("pid") in named
                   and str(e.get("cat", "")).lower() not in _DEVICE_CAT)
        # host ops that run only on a GPU (cuDNN, MIOpen): a device ran, recorded or not
        dev += sum(1 for e in events if isinstance(e, dict) and _GPU_ONLY_OP.match(str(e.get("name", ""))))
        if dev or launches:
            out.append(f"classified host-only, but {f.name} holds {dev} device event(s) and {launches} launch(es)")
    return out


# (the Habana bridge's plug-in names its device process "/device:HPU:0")
_DEVICE_PROCESS = re.compile(r"ascend hardware|^(ascend )?(npu|hpu|xpu|mtia|gaudi)\b|^/device:[a-z]+:\d", re.I)
_GPU_ONLY_OP = re.compile(r"^aten::_?(cudnn|miopen)_(?!is_acceptable)")


_PRODUCER = {"kineto": "Kineto", "legacy-autograd": "legacy list export", "unknown": "unknown writer"}
_STEPS = {"profiler-step": "ProfilerStep", "cycles": "cycles", "none": "no steps"}


def _kind(doc: dict) -> str:
    """The input kind fsdpdoctor gave the trace (rank 0's): producer, device timeline, steps, clock."""
    k = (doc.get("job") or {}).get("input_kind")
    if not k:
        return "-"
    device = k["device"] + (" (read generically)" if k.get("generic") else "")
    parts = [_PRODUCER.get(k["producer"], k["producer"]), device, _STEPS.get(k["steps"], k["steps"])]
    if k.get("clock_offset_us") is not None:
        parts.append(f"device clock +{k['clock_offset_us']:.0f} us")
    elif k.get("backward_links"):
        parts.append(f"{k['backward_links']} backward link(s)")
    if k.get("unknown"):
        parts.append("unread: " + k["unknown"][0].split(":")[0])
    return ", ".join(parts)


def _verdict(o: Outcome) -> str:
    if o.rc != 0:
        return f"refused: {o.error}"
    if not o.findings:
        return "no finding"
    top = []
    for f in o.findings[:3]:
        frac = f.get("impact_frac")
        top.append(f"{f['severity']} `{f['id']}`" + (f" {100 * frac:.0f} %" if frac else "")
                   + (f" (under {f['caused_by']})" if f.get("caused_by") else ""))
    more = len(o.findings) - 3
    return "; ".join(top) + (f"; +{more} more" if more > 0 else "")


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


# what was searched for the accelerators the corpus holds no torch.profiler recording of (session 11)
MISSING_DEVICES = [
    "No public torch.profiler recording of an Intel XPU or a Habana Gaudi (HPU) could be fetched; their",
    "readings are tested on minimal traces built to their writers' shapes (tests/test_input_kind.py: Kineto's",
    "XPU plug-in, libkineto/src/plugin/xpupti; the Habana bridge's Kineto plug-in,",
    "HabanaAI/gaudi-pytorch-bridge backend/profiling). Looked for: the code, issue and page indexes",
    "(xpu_runtime, urEnqueueKernelLaunch, xpupti_version, hpu_op, /device:HPU, *xpu*/*hpu* trace names,",
    "ProfilerActivity.XPU/HPU), and the files and history of intel/torch-xpu-ops,",
    "intel/intel-extension-for-pytorch, intel/intel-xpu-backend-for-triton, intel/ai-reference-models,",
    "sgl-project/sgl-kernel-xpu, pytorch/kineto (its XPU tests build traces in memory), HabanaAI/",
    "(Gaudi-tutorials, Model-References, gaudi-pytorch-bridge, vllm-fork, Intel_Gaudi3_Software),",
    "huggingface/optimum-habana, vllm-project/vllm-gaudi, Lightning-AI/lightning-Habana and argonne-lcf/",
    "(ALCF_Hands_on_HPC_Workshop, ai-science-training-series, DL-Profiling-Examples, mlprof). Two real sets",
    "exist but are not in the stored snapshots: ALCF_Hands_on_HPC_Workshop's four Aurora XPU DDP traces",
    "(data_science/ai_ml_profiling/example_traces, 2025-10-08; files of 4 MiB and more are left out; their",
    "key_averages tables are there and name what such a trace holds: c10d::allreduce_, xccl:all_reduce,",
    "oneCCL's allreduce_large_read_write_ipc and invoke_barrier kernels) and Gaudi-tutorials' three",
    "swin_profile *.pt.trace.json (Git LFS pointers in every version). The only Gaudi-stack trace file",
    "found, the bridge's synapse_logger test slice, is listed above (refused: not JSON).",
]


def write_report(outcomes: list[Outcome], path: Path = REPORT) -> None:
    traces = load_list()
    repos = sorted({t.repo for t in traces})
    ran = [o for o in outcomes]
    viol = sum(1 for o in ran if o.violations)
    contra = sum(1 for o in ran for d in o.disagreements if "rules out" in d and " at error" in d)
    suspect = sum(1 for o in ran if any(d.startswith("suspicious") for d in o.disagreements))
    suspect_errors = sum(1 for o in ran for d in o.disagreements if d.startswith("suspicious") and " at error " in d)
    disagree = [o for o in ran if o.disagreements]
    lines = [
        "# The public corpus: traces nobody here recorded",
        "",
        "Written by `python benchmarks/corpus.py run` (see its docstring; the list with provenance and",
        "sha256 is `benchmarks/corpus.toml`, the files are fetched into a cache outside the repository and",
        "never committed). Every trace is analysed with `fsdpdoctor analyze --json` and its result checked",
        "for the invariants twice: by the project's checker (`fsdpdoctor/analysis/invariants.py`: what it",
        "had to bound or withhold before rendering, and what it still finds) and by this script on its own",
        "(shares in [0, 1], parts adding up to the step, a finding's impact at most its step, root findings",
        "together at most the step). *Agrees* compares our verdict with what the",
        "source says the trace is: a finding the source rules out at warning or error, a training-only",
        "finding on an inference trace, an error from one step of one rank, a miss of what the source",
        "shows, or no communication counted where the source describes it (all-to-all through DeepEP",
        "included) is a disagreement, and so is a refusal (exit 2, one line) of a valid recording (another",
        "tool's file in Chrome's event format, kind `not-kineto`, is rightly refused). Marked",
        "*suspicious* without a source statement: a root finding that claims the whole step (no fix saves",
        f"the work itself), a step under 1 % of its rank's median, or one more than {SPAN_FACTOR}x it (it",
        "spans a gap, not work). Each one is explained below the table. *Input kind* is how fsdpdoctor",
        "classified the file at the front door (`fsdpdoctor/trace/kind.py`, `job.input_kind` in `--json`): its",
        "writer, its device timeline (cuda, rocm, copies-only, another accelerator's spans read generically",
        "or named as not analysed, missing although kernels were launched, none), its step markers, its",
        "clock, and the first thing it could not read (whose figures are withheld).",
        "",
        f"**{len(ran)} traces from {len({o.trace.repo for o in ran})} repositories** "
        f"({len(traces)} listed from {len(repos)}); **{viol} with an invariant violation**; "
        f"**{contra} error-level finding(s) the source contradicts**; {len(disagree)} trace(s) with a "
        f"disagreement, {suspect} of them suspicious without a source statement ({suspect_errors} error-level "
        "finding(s) among those).",
        "",
        "| trace | source | what the source says | input kind | steps x ranks, mean step | our verdict (top findings) "
        "| agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in ran:
        t = o.trace
        shape = f"{o.steps} x {o.ranks}" + (f", {o.step_ms:.1f} ms" if o.step_ms else "") if o.rc == 0 else "-"
        agree = "yes" if o.agrees else "**no**"
        refused_as = ("not a torch.profiler", "not a Chrome/Kineto trace", "not valid JSON")
        kind = o.kind if o.rc == 0 else "not a recording" if any(r in (o.error or "") for r in refused_as) else "-"
        lines.append(f"| `{t.id}` | [{t.repo}@{t.commit[:8]}]({t.url}) | {_cell(t.says)} | {_cell(kind)} | {shape} | "
                     f"{_cell(_verdict(o))} | {agree} |")
    lines += ["", "## Disagreements and violations, explained", ""]
    if not any(o.disagreements or o.violations for o in ran):
        lines.append("None.")
    for o in ran:
        if not (o.disagreements or o.violations):
            continue
        lines.append(f"- `{o.trace.id}`: " + "; ".join(o.violations + o.disagreements) + ". "
                     + (o.trace.note or "**Not yet explained.**"))
    lines += ["", "## Devices without a public recording here", "", *MISSING_DEVICES]
    lines += ["", "## Reproducing", "", "```bash",
              "python benchmarks/corpus.py fetch            # or: fetch --from DIR_OF_GIT_MIRRORS",
              "python benchmarks/corpus.py run              # rewrites this file", "```", ""]
    path.write_text("\n".join(lines))


def run(only: list[str] | None) -> int:
    root = cache_dir()
    out_dir = root / "_results"
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = [t for t in load_list() if not only or t.id in only]
    missing = [t.id for t in traces if not is_cached(t, root)]
    if missing:
        print(f"corpus: {len(missing)} trace(s) not cached ({', '.join(missing[:5])}...): run `fetch` first",
              file=sys.stderr)
        return 2
    outcomes = []
    for t in traces:
        o = run_one(t, root, out_dir)
        outcomes.append(o)
        mark = "ok  " if o.agrees else "DIFF"
        print(f"{mark} {t.id:44s} {o.seconds:5.1f} s  {_verdict(o)[:90]}")
        for v in o.violations + o.disagreements:
            print(f"       {v}")
    (root / "results.json").write_text(json.dumps(
        [{"id": o.trace.id, "rc": o.rc, "error": o.error, "steps": o.steps, "ranks": o.ranks,
          "step_ms": o.step_ms, "findings": [(f["id"], f["severity"], f.get("impact_frac")) for f in o.findings],
          "violations": o.violations, "disagreements": o.disagreements} for o in outcomes], indent=1))
    if not only:
        write_report(outcomes)
        print(f"corpus: wrote {REPORT.relative_to(ROOT)}")
    return 1 if any(o.violations for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="put the listed traces into the cache, verifying sha256")
    f.add_argument("--from", dest="mirrors", type=Path, metavar="MIRRORS_DIR",
                   help="folder of git mirrors or clones named owner+name (default: git clone from GitHub)")
    r = sub.add_parser("run", help="analyse every cached trace, check invariants, write docs/corpus.md")
    r.add_argument("--only", nargs="*", metavar="ID", help="only these traces (docs/corpus.md is not written)")
    args = ap.parse_args(argv)
    return fetch(args.mirrors) if args.cmd == "fetch" else run(args.only)


if __name__ == "__main__":
    sys.exit(main())
