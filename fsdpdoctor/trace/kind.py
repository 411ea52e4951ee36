"""What a trace file is, decided once when it is read: ``classify`` gives each rank's table its
``InputKind`` (producer, device timeline, step structure, clock quality) with the evidence, and the
readings after it (dialects, the report header, ``--json``) ask the kind instead of guessing again.

What cannot be read is named in ``InputKind.unknown``; another tool's file is refused in one line.
"""

from __future__ import annotations

import re

import numpy as np

from fsdpdoctor.errors import InputError
from fsdpdoctor.results import InputKind
from fsdpdoctor.trace.table import (
    ACCELERATOR, ANNOTATION, CPU_OP, DEVICE_CATEGORIES, KERNEL, MEMCPY, MEMSET, OTHER, PYFUNC, RUNTIME, RankTrace,
    category_code, distinct,
)
from fsdpdoctor.trace.vocabulary import LIBRARY_ANNOTATIONS, STEP_NAME, found_in

# the legacy autograd profiler's list export (torch.autograd.profiler EventList.export_chrome_trace,
# still what a torch build without Kineto writes): no "cat", host ops on the pid "CPU functions" (the
# C++ writer of torch.autograd.profiler.RecordProfile spells it "CPU Functions")
LEGACY_HOST_PID = "CPU functions"
_LEGACY_PIDS = ("cpu functions", "cuda functions")
# the categories other accelerators' profiler plug-ins write their device and runtime events under
# (Meta MTIA: mtia_ccp_events, mtia_runtime; Intel XPU, Habana HPU, Ascend NPU, PrivateUse1 backends)
_ACCELERATOR = ACCELERATOR
_ACCELERATOR_NAMES = {"habana": "hpu", "gaudi": "hpu", "ascend": "npu"}
# the host runtime calls that launch device work (kernels, graphs)
_LAUNCH = re.compile(r"^(cuda|cu|hip|hipExt)(Module)?(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|"
                     r"GraphLaunch|ModuleLaunchKernel)(_v\d+|_ptsz)?$")
# host and device clocks are rounded to the microsecond apart: a device event may start this much
# before its launch (the same slack as ``RankContext.launch_rows``)
CLOCK_SLACK_US = 1.0
# backward links are a clock offset (and the shift that makes them causal is applied) when most links
# run backwards; a few backward links among forward ones are reused ids, dropped and counted
SYSTEMATIC_BACKWARD = 0.5
_CUDA_API = re.compile(r"^(cuda|cu[A-Z])")  # runtime (cudaMalloc) and driver (cuMemAlloc_v2) API calls
_TORCH_NAMES = re.compile(r"^(aten::|ProfilerStep#|c10d::|nccl:|gloo:|autograd::|Optimizer\.)")


def classify(t: RankTrace, meta: dict | None) -> InputKind:
    """The kind of ``t`` (and ``t.kind`` set). A legacy list export's host ops are made host ops
    (the only change to the table besides a consistent clock offset); another tool's file is refused."""
    kind = InputKind()
    kind.producer = _producer(t, meta or {}, kind.evidence)
    if kind.producer == "legacy-autograd":
        _read_legacy(t)
    _device(t, meta or {}, kind)
    kind.steps = step_structure(t, kind.evidence)
    _clock(t, kind)
    _empty(t, kind)
    t.kind = kind
    return kind


def step_structure(t: RankTrace, evidence: list[str] | None = None) -> str:
    """"profiler-step" (ProfilerStep#N spans), "cycles" (several profiler cycles, no step marker) or "none"."""
    steps = [n for n in t.names if STEP_NAME.match(n)]
    if steps:
        if evidence is not None:
            evidence.append(f"{len(steps)} ProfilerStep# marker(s)")
        return "profiler-step"
    return "cycles" if t.cycles else "none"


def _producer(t: RankTrace, meta: dict, evidence: list[str]) -> str:
    known = {c for c, n in t.categories.items() if n and c and _known(c)}
    pids = {str(tr.pid).lower() for tr in t.tracks}
    if not t.categories.keys() - {""} and pids and pids <= set(_LEGACY_PIDS):
        evidence.append(f"a list of events without categories on pid '{LEGACY_HOST_PID}': the legacy "
                        "autograd-profiler export")
        return "legacy-autograd"
    schema = meta.get("schemaVersion")
    if known or any(_TORCH_NAMES.match(n) for n in t.names):
        evidence.append(f"torch.profiler (Kineto{f', schema {schema}' if schema is not None else ''}, "
                        f"{'event list' if t.format == 'event-list' else 'trace document'})")
        return "kineto"
    # no torch op, and categories none of them the profiler's (or none at all, off the legacy export's
    # pids): another tool's file (an eBPF CUDA-API monitor, a kernel timeline...), refused in one line
    written = sorted((c for c in t.categories if c), key=lambda c: -t.categories[c])
    looks = ("a CUDA API trace" if any(_LAUNCH.match(n) or _CUDA_API.match(n) for n in t.names)
             else "another tool's Chrome trace")
    cats = (f"in categories {', '.join(repr(c) for c in written[:4])}{' ...' if len(written) > 4 else ''}, "
            "none of the profiler's" if written else "without categories")
    raise InputError(t.path, f"not a torch.profiler recording: {looks} ({t.n_events} events {cats}, no torch op)")


def _known(cat: str) -> bool:
    from fsdpdoctor.trace.table import category_code
    return category_code(cat) != OTHER or _ACCELERATOR.match(cat) is not None \
        or cat.lower() in ("trace", "ac2g", "fwdbwd", "cpu_instant_event", "python_function")


# the record_function ranges torch itself opens, which Kineto writes as user annotations, not ops: the
# step marker (as an op it made the whole step compute), the optimizer's, the DataLoader's, DDP's and FSDP's
# forward, the communication libraries' spans (gloo:all_reduce on its worker thread, nccl:all_reduce)
_LEGACY_ANNOTATION = re.compile(rf"^(ProfilerStep#\d+$|Optimizer\.|enumerate\(DataLoader\)|DistributedDataParallel\."
                                rf"|FullyShardedDataParallel\.|FSDP::|{'|'.join(map(re.escape, LIBRARY_ANNOTATIONS))})")


def _read_legacy(t: RankTrace) -> None:
    """The legacy export's events have no category: those on its host pid are host ops, except the
    ranges torch annotates (``_LEGACY_ANNOTATION``), which are annotations as Kineto writes them."""
    host = np.array([str(tr.pid).lower() == _LEGACY_PIDS[0] for tr in t.tracks], dtype=bool)
    if len(host):
        annotated = np.array([_LEGACY_ANNOTATION.match(n) is not None for n in t.names], dtype=bool)
        on_host = (t.cat == OTHER) & host[t.track]
        t.cat[on_host] = CPU_OP
        t.cat[on_host & annotated[t.name_id]] = ANNOTATION
    t._ids_by_cat = None


def _device(t: RankTrace, meta: dict, kind: InputKind) -> None:
    ev, unknown = kind.evidence, kind.unknown
    counts = np.bincount(t.cat, minlength=OTHER + 1)
    kernels, copies = int(counts[KERNEL]), int(counts[MEMCPY] + counts[MEMSET])
    launches = _launches(t)
    accel = {c: n for c, n in t.categories.items() if c and _ACCELERATOR.match(c)}
    accel_spans = {c: n for c, n in accel.items() if category_code(c) == KERNEL}
    if accel_spans:  # another accelerator's device spans (made kernels by the loader): read by shape
        _accelerator(t, meta, kind, accel)
        return
    named = _named_devices(t)
    if kernels:
        rocm = any(n.startswith("hip") for n in t.names) or "amd" in str(_device_name(meta)).lower()
        # kernels in "kernel" launched through another accelerator's runtime category (Intel XPU's
        # xpu_runtime, a PrivateUse1 backend's privateuse1_runtime): that accelerator's, not CUDA's
        runtime = max((c for c in accel if category_code(c) == RUNTIME), key=accel.get, default=None)
        launcher = _accelerator_name(runtime) if runtime else None
        on = {d: n for d, (n, _) in named.items() if n} if not launcher else {}
        other = max(on, key=on.get) if on else None  # kernels on an accelerator's own process (torch_npu...)
        kind.device = other or launcher or ("rocm" if rocm else "cuda")
        # read as any kernel timeline; the header names XPU's "XPU kernels" (results._DEVICES), another
        # launcher's as that accelerator's spans read generically, never "CUDA kernels"
        kind.generic = other is not None or launcher not in (None, "xpu")
        ev.append(f"{kernels} kernel(s)" + (f", {copies} copies/memsets" if copies else "")
                  + (f" launched through {runtime}: read as a device timeline" if launcher else "")
                  + (f" on {named[other][1]!r}: read as a device timeline" if other else ""))
        return
    if copies:
        kind.device = "copies-only"
        ev.append(f"{copies} device copies/memsets, no kernel")
        return
    if accel:
        _accelerator(t, meta, kind, accel)
        return
    if named:  # device events without a device category, on a process or stream named as the device
        name = max(named, key=lambda d: named[d][0])
        n, where = named[name]
        kind.device = name
        ev.append(f"{n} event(s) on {where!r}")
        why = _read_named(t, name)
        if why is None:
            kind.generic = True
            ev.append(f"{name.upper()} read generically: {_generic_counts(t)}")
        else:
            unknown.append(f"{name.upper()} device events are not analysed ({n} event(s) on {where!r}, in no device "
                           f"category: {why}): device figures (compute, idle, overlap) are unknown")
        return
    if launches:
        kind.device = "missing"
        unknown.append(f"device timeline missing: {launches} kernel launch(es), no kernel events (was the "
                       "profiler started with ProfilerActivity.CUDA?)")
        return
    if kind.producer == "legacy-autograd" and any(n.startswith("nccl:") for n in t.names):
        kind.device = "missing"
        unknown.append("device timeline missing: NCCL collectives ran on a GPU, and the legacy autograd-profiler "
                       "export writes no device events (record with torch.profiler and ProfilerActivity.CUDA)")
        return
    gpu_ops = _gpu_only_ops(t)
    if gpu_ops:
        n, name = gpu_ops
        kind.device = "missing"
        unknown.append(f"device timeline missing: {n} host op(s) that run only on a GPU ({name}...), no device "
                       "events (was the profiler started with ProfilerActivity.CUDA?)")
        return
    _declared_but_empty(meta, kind)


def _declared_but_empty(meta: dict, kind: InputKind) -> None:
    """No device event, no launch: a host-only recording, unless the document declares GPUs
    (``deviceProperties``) and says the job used them (the NCCL backend, which runs on GPUs only). Then it
    is a GPU trace without device events: what ran on the device, and so the step's parts, cannot be
    measured (the host's ops only queue the device's work), and the breakdown is withheld."""
    props = meta.get("deviceProperties")
    gpus = [d for d in props if isinstance(d, dict)] if isinstance(props, list) else []
    dist_info = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    backend = str(dist_info.get("backend") or "")
    if not gpus:
        kind.device = "none"
        return
    names = sorted({str(d.get("name") or "GPU") for d in gpus})
    declared = f"{len(gpus)} GPU(s) declared ({', '.join(names[:2])}) in deviceProperties"
    if "nccl" not in backend.lower():
        kind.device = "none"
        kind.evidence.append(f"{declared}, but no device event, no launch and no GPU backend: read as a host-only "
                             "job (the profiler lists the host's GPUs whether the job uses them or not)")
        return
    kind.device = "empty"
    kind.evidence.append(f"{declared} and backend {backend}; no kernel, copy, launch or runtime call")
    kind.unknown.append(f"GPU trace without device events: {declared} and the {backend} backend, but no kernel, "
                        "copy or runtime call was recorded, so the device's compute, idle and overlap with "
                        "communication could not be measured (was the profiler started with "
                        "ProfilerActivity.CUDA, and did CUPTI record?)")


# host ops that exist only on a GPU (cuDNN, MIOpen): a recording that holds them ran on one, whatever the
# profiler was asked to record of its device; not aten::cudnn_is_acceptable, the check a CPU GRU/LSTM runs too
_GPU_ONLY_OP = re.compile(r"^aten::_?(cudnn|miopen)_(?!is_acceptable)")


def _gpu_only_ops(t: RankTrace) -> tuple[int, str] | None:
    """(count, first name) of the host ops in ``t`` that run only on a GPU, or None."""
    ids = [i for i, n in enumerate(t.names) if _GPU_ONLY_OP.match(n)]
    if not ids:
        return None
    n = int(np.isin(t.name_id[t.cat == CPU_OP], ids).sum())
    return (n, t.names[ids[0]]) if n else None


# an accelerator's device span by its name: a copy (DMA, memcpy), or a queue waiting on / recording an
# event (no work: idle, as a CUDA stream's gap); everything else on a device queue is work (a kernel)
_COPY_SPAN = re.compile(r"dma|memcpy|mem_?copy|copy|h2d|d2h|htod|dtoh", re.I)
_WAIT_SPAN = re.compile(r"wait|event_record|record_?event|sync|fence|signal|barrier", re.I)
# by vocabulary.found_in: each alternative holds a needle ("memcpy" no "copy"); ~10x faster per name
_copy_span = found_in(_COPY_SPAN, ("dma", "memcpy", "copy", "h2d", "d2h", "htod", "dtoh"))
_wait_span = found_in(_WAIT_SPAN, ("wait", "event_record", "record", "sync", "fence", "signal", "barrier"))


def read_accelerator(t: RankTrace, evidence: list[str] | None = None) -> str | None:
    """Another accelerator's events read by their shape, one mechanism for every plug-in. The loader
    made its runtime categories runtime calls and its other categories device spans (``ACCELERATOR``);
    here the shape is checked: device spans must lie on tracks of a process that holds no host op (a
    device's streams/queues). Where the file names a process or stream as the device ("/device:HPU:0",
    "NPU 0"...), only the spans there are the device's: Habana's plug-in writes its host-side calls under
    the same category ("hpu_op", Kineto's "HPU host side runtime event") on processes of their own
    (Bridge Logs, the Synapse API threads), which hold no host op either. Copies and event waits are told
    by name, the rest is device work. Returns why the shape cannot be read (its spans then set back to
    OTHER), or None once read; ``evidence`` gains the count of spans set aside as off the device."""
    spans = np.nonzero(np.isin(t.cat, DEVICE_CATEGORIES))[0]
    host_pids = {t.tracks[i].pid for i in distinct(t.track[np.isin(t.cat, (CPU_OP, PYFUNC))]).tolist()}
    on_device = np.array([tr.pid not in host_pids for tr in t.tracks], dtype=bool)
    named = np.array([_track_device(tr) is not None for tr in t.tracks], dtype=bool)
    if (named & on_device).any():
        off = on_device[t.track[spans]] & ~named[t.track[spans]] & (t.dur[spans] > 0)
        if off.any() and evidence is not None:
            where = sorted({t.tracks[i].process.split("|")[0].strip() or str(t.tracks[i].pid)
                            for i in distinct(t.track[spans[off]]).tolist()})
            evidence.append(f"{int(off.sum())} span(s) off the device's own process ({', '.join(where[:3])}"
                            f"{' ...' if len(where) > 3 else ''}): host-side calls, not device work")
        on_device &= named
    ok = on_device[t.track[spans]] & (t.dur[spans] > 0)
    t.cat[spans[~ok]] = OTHER
    spans = spans[ok]
    if not len(spans):
        t._ids_by_cat = None
        return "no spans on a device stream or queue, only host-side events"
    copy = np.array([_copy_span(n) for n in t.names], dtype=bool)
    wait = np.array([_wait_span(n) for n in t.names], dtype=bool)
    ids = t.name_id[spans]
    t.cat[spans[copy[ids]]] = MEMCPY
    t.cat[spans[wait[ids] & ~copy[ids]]] = OTHER
    busy = set(distinct(t.track[np.isin(t.cat, DEVICE_CATEGORIES)]).tolist())
    for i, tr in enumerate(t.tracks):
        tr.is_device = i in busy
    t._ids_by_cat = t._rows_by_id = None
    return None


def _accelerator_name(cat: str) -> str:
    """The device an accelerator category names (hpu_op -> hpu, gaudi... -> hpu, ascend... -> npu)."""
    name = _ACCELERATOR.match(cat).group(1).lower()
    return _ACCELERATOR_NAMES.get(name, name)


def _generic_counts(t: RankTrace) -> str:
    n = np.bincount(t.cat, minlength=OTHER + 1)
    return (f"{int(n[KERNEL])} device spans as work, {int(n[MEMCPY])} as copies, event waits as idle, "
            f"{int(n[RUNTIME])} runtime calls")


def _accelerator(t: RankTrace, meta: dict, kind: InputKind, accel: dict[str, int]) -> None:
    """Another accelerator named by its categories and backend, its device spans read generically where
    their shape allows (``read_accelerator``), else named as not analysed with the reason."""
    ev, unknown = kind.evidence, kind.unknown
    name = _accelerator_name(max(accel, key=accel.get))
    kind.device = name
    backend = (meta.get("distributedInfo") or {}).get("backend") if isinstance(meta.get("distributedInfo"), dict) else None
    ev.append(", ".join(f"{n} {c}" for c, n in sorted(accel.items(), key=lambda x: -x[1]))
              + (f"; backend {backend}" if backend else ""))
    why = read_accelerator(t, ev)
    if why is None:
        kind.generic = True
        ev.append(f"{name.upper()} read generically: {_generic_counts(t)}")
    else:
        unknown.append(f"{name.upper()} device events are not analysed ({why}): device figures (compute, "
                       "idle, overlap) are unknown")


# a process (by its name or label) or a stream named as another accelerator's: torch_npu writes its
# device events on "Ascend Hardware" (label "NPU") or an "NPU" process with "NPU stream N" threads
# device "/device:HPU:0" (the Habana bridge's Kineto plug-in, TensorFlow's spelling)
_DEVICE_PROCESS = re.compile(r"^(?:ascend hardware|/device:(npu|hpu|xpu|mtia|gaudi|habana):\d+"
                             r"|(?:ascend )?(npu|hpu|xpu|mtia|gaudi|habana)(?: stream)?(?: \d+)?)$", re.I)


def _track_device(tr, labels: bool = True) -> tuple[str, str] | None:
    """(device, the label that names it) where a track's process or thread is named as another
    accelerator's, else None. ``labels=False`` leaves out the process's labels: torch_npu labels its
    derived "Overlap Analysis" process "NPU" too, whose Computing/Free spans are no device stream's."""
    names = [p.strip() for p in tr.process.split("|")]
    for label in (names if labels else names[:1]) + [tr.name]:
        m = _DEVICE_PROCESS.match(label)
        if m:
            device = (m.group(1) or m.group(2) or "ascend").lower()
            return _ACCELERATOR_NAMES.get(device, device), label
    return None


def _named_devices(t: RankTrace) -> dict[str, tuple[int, str]]:
    """Complete events on the tracks of a process or stream named as another accelerator's, by device:
    (events, the name that says so). Kernels there are that device's, not CUDA's."""
    counts = np.bincount(t.track[np.isin(t.cat, DEVICE_CATEGORIES)], minlength=len(t.tracks)) if t.n_events else []
    out: dict[str, tuple[int, str]] = {}
    for i, tr in enumerate(t.tracks):
        named = _track_device(tr) if tr.n_events else None
        if named:
            name, label = named
            n, where = out.get(name, (0, label))
            out[name] = (n + (int(counts[i]) if len(counts) and counts[i] else tr.n_events), where)
    return out


# a communication library's per-group track of collectives on a process labelled as the device: torch_npu
# writes HCCL's collectives (hcom_allReduce_...) on process "HCCL" (label NPU), thread "Group N
# Communication", one span per collective on the device; its "Plane N" threads hold their sub-tasks
_COMM_GROUP = re.compile(r"^group \d+ communication$", re.I)

# a device timeline read from a named process needs more than a stray span: at least this many spans
# (torch_npu writes one per task on each "Stream N" of "Ascend Hardware")
MIN_NAMED_SPANS = 2


def _read_named(t: RankTrace, name: str) -> str | None:
    """The uncategorised complete events on the tracks of the process or stream named as device ``name``
    (torch_npu's "Ascend Hardware" tasks) are that device's spans, read by shape like any accelerator's
    (``read_accelerator``). Returns why they cannot be read, or None once read."""
    tracks = [i for i, tr in enumerate(t.tracks) if (_track_device(tr, labels=False) or ("",))[0] == name
              or (_COMM_GROUP.match(tr.name) and (_track_device(tr) or ("",))[0] == name)]
    rows = np.nonzero(np.isin(t.track, tracks) & (t.cat == OTHER) & (t.dur > 0))[0]
    if len(rows) < MIN_NAMED_SPANS:
        return f"{len(rows)} span(s) with a duration, too few to read as a timeline"
    t.cat[rows] = KERNEL
    t._ids_by_cat = None
    return read_accelerator(t)


def _device_name(meta: dict):
    props = meta.get("deviceProperties")
    return props[0].get("name") if isinstance(props, list) and props and isinstance(props[0], dict) else None


def _launches(t: RankTrace) -> int:
    ids = [i for i, n in enumerate(t.names) if _LAUNCH.match(n)]
    if not ids:
        return 0
    return int(np.isin(t.name_id[t.cat == RUNTIME], ids).sum()) + int(np.isin(t.name_id[t.cat == OTHER], ids).sum())


def _clock(t: RankTrace, kind: InputKind) -> None:
    """Host->device links (a runtime call and the device event of its correlation id) that run backwards
    are counted; when most do, the device clock is shifted by the least offset that makes every link
    causal, and that offset is named; otherwise the backward links are dropped (``launch_rows``)."""
    dev = np.nonzero(np.isin(t.cat, DEVICE_CATEGORIES) & (t.corr >= 0))[0]
    rt = np.nonzero((t.cat == RUNTIME) & (t.corr >= 0))[0]
    if not len(dev) or not len(rt):
        return
    order = np.argsort(t.corr[rt], kind="stable")
    keys, launch = t.corr[rt][order], rt[order]
    i = np.minimum(np.searchsorted(keys, t.corr[dev], side="right") - 1, len(keys) - 1)
    ok = (i >= 0) & (keys[np.maximum(i, 0)] == t.corr[dev])
    if not ok.any():
        return
    lag = t.ts[dev[ok]] - t.ts[launch[i[ok]]]
    kind.links = int(ok.sum())
    back = lag < -CLOCK_SLACK_US
    kind.backward_links = int(back.sum())
    if not kind.backward_links:
        return
    if kind.backward_links >= SYSTEMATIC_BACKWARD * kind.links:
        shift = float(-lag.min())
        t.ts[np.isin(t.cat, DEVICE_CATEGORIES)] += shift
        kind.clock_offset_us = shift
        kind.evidence.append(f"{kind.backward_links} of {kind.links} device events start before their launch: "
                             f"the device clock runs {shift:.1f} us behind the host's, shifted by that much")
    else:
        kind.evidence.append(f"{kind.backward_links} of {kind.links} device events start before their launch "
                             "(reused correlation ids?): those links are not used")
    if t.quality is not None:
        t.quality.notes.append(kind.evidence[-1])


def _empty(t: RankTrace, kind: InputKind) -> None:
    """A recording with no host op (besides its step markers), no Python frame and no device event holds
    no work to analyse (a few runtime calls under a step marker are not a step of work)."""
    markers = [i for i, n in enumerate(t.names) if STEP_NAME.match(n)]
    work = np.isin(t.cat, (CPU_OP, PYFUNC) + DEVICE_CATEGORIES) & ~np.isin(t.name_id, markers)
    if not work.any():
        span = float((t.ts + t.dur).max() - t.ts.min()) if t.n_events else 0.0
        kind.unknown.insert(0, f"empty recording: {t.n_events} event(s) over {span / 1e6:.3g} s, no host op or "
                               "device event to analyse")
