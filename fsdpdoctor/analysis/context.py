"""Per-rank lookups that many analyses share: the main thread, phase windows,
enclosing annotations and the user's source line from Python stacks."""

from __future__ import annotations

import re
import sys
from functools import cached_property

import numpy as np

from fsdpdoctor.analysis import intervals as iv
from fsdpdoctor.trace.table import ANNOTATION, CPU_OP, DEVICE_CATEGORIES, PYFUNC, RUNTIME, RankTrace, distinct
from fsdpdoctor.trace.vocabulary import STEP_NAME

DATALOADER_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__")
OPTIMIZER_PREFIX = "Optimizer.step#"
ZERO_GRAD_PREFIX = "Optimizer.zero_grad#"
# where a module's forward runs: the Python tracer's module frames, the wrappers' own annotations
FORWARD_FRAME_PREFIX = "nn.Module: "
FORWARD_ANNOTATIONS = ("DistributedDataParallel.forward", "FullyShardedDataParallel.forward")
BACKWARD_MARKERS = ("autograd::engine::evaluate_function:", "FSDP::root_post_backward_callback")
SYNC_NAMES = {"aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
              "cudaEventSynchronize", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize"}
_FRAME_RE = re.compile(r"^(?P<file>[^()<>]+)\((?P<line>\d+)\): (?P<func>.+)$")
_NOT_USER = ("torch/", "site-packages/", "dist-packages/", "fsdpdoctor/capture", "/lib/python", "importlib/",
             "<frozen", "numpy/", "multiprocessing/", "concurrent/")
_STDLIB = set(getattr(sys, "stdlib_module_names", ()))
# Kineto names frames relative to their sys.path entry ("transformers/models/...py"), dropping the
# site-packages prefix, so libraries are told apart by their top-level package: the common ones of
# training jobs. Only the frame's own path and this list decide, never what is installed where the
# analysis runs: the same trace gives the same verdict on every machine.
_LIBRARIES = frozenset("""
torch torchvision torchaudio torchtext torchdata torchao torchtune torchtitan functorch triton torchrec
torchmetrics torch_geometric torch_xla torch_tensorrt fbgemm_gpu dgl torchdistx torchsnapshot
transformers accelerate datasets tokenizers safetensors huggingface_hub peft trl diffusers evaluate
timm lightning pytorch_lightning lightning_fabric lightning_utilities deepspeed megatron apex
transformer_engine flash_attn xformers fairscale composer colossalai bitsandbytes vllm thunder webdataset
habana_frameworks intel_extension_for_pytorch optimum sentence_transformers open_clip mmcv mmengine
numpy scipy pandas pyarrow sklearn einops tqdm wandb tensorboard tensorboardX mlflow hydra omegaconf
sentencepiece tiktoken PIL cv2 fsspec absl jax yaml rich click packaging typing_extensions fsdpdoctor
google grpc protobuf requests urllib3 filelock psutil jinja2 sympy networkx h5py zarr ray dask distributed
optuna onnx onnxruntime pydantic attr attrs dill cloudpickle msgspec setuptools pkg_resources
_pytest pytest hypothesis botocore boto3 s3transfer aiohttp regex _distutils_hack
""".split())


def is_user_frame(name: str) -> bool:
    """A Python frame in the user's code, not torch/stdlib/site-packages or a known library."""
    m = _FRAME_RE.match(name)
    if not m:
        return False
    f = m.group("file")
    if any(s in f for s in _NOT_USER):
        return False
    stem = f.rsplit("/", 1)[-1].removesuffix(".py")
    top = f.split("/", 1)[0].removesuffix(".py")
    if "/" in f and top in _LIBRARIES:
        return False
    return stem not in _STDLIB and top not in _STDLIB


class RankContext:
    """Lazily computed indexes over one ``RankTrace``."""

    def __init__(self, trace: RankTrace, dialect):
        self.t = trace
        self.end = trace.ts + trace.dur
        self._by_track: dict[int, tuple] = {}  # enclosing(): id(rows) -> (rows, its per-track index)
        self.notes: list[str] = []   # what the dialect could not classify or took on weaker evidence
        self.dialect_impl = dialect   # the ``Dialect`` that reads this rank (``dialects.detect``)

    @property
    def traits(self):
        return self.dialect_impl.traits

    # -- threads -------------------------------------------------------
    @cached_property
    def step_rows(self) -> np.ndarray:
        rows = self.t.rows_named(lambda n: STEP_NAME.match(n) is not None, cat=(ANNOTATION, CPU_OP))
        if len(rows) == 0:
            return rows
        # keep one event per step number (some traces repeat them)
        seen, keep = set(), []
        for r in rows:
            n = self.t.name(r)
            if n not in seen:
                seen.add(n)
                keep.append(r)
        return np.asarray(keep, dtype=np.int64)

    @cached_property
    def main_track(self) -> int:
        if len(self.step_rows):
            return int(self.t.track[self.step_rows[0]])
        cpu = self.t.cat == CPU_OP
        if cpu.any():
            return int(np.bincount(self.t.track[cpu]).argmax())
        return int(np.bincount(self.t.track).argmax())

    @cached_property
    def compute_tracks(self) -> np.ndarray:
        """Host threads that run model compute: main thread + autograd threads."""
        bwd = self.rows_prefix(BACKWARD_MARKERS[0], CPU_OP)
        return distinct(np.concatenate([[self.main_track], self.t.track[bwd]])).astype(np.int32)

    @cached_property
    def _launch_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted correlation ids, their runtime rows): the last runtime call of an id wins."""
        rt = np.nonzero(self.t.cat == RUNTIME)[0]
        c = self.t.corr[rt]
        rt, c = rt[c >= 0], c[c >= 0]
        order = np.argsort(c, kind="stable")
        c, rt = c[order], rt[order]
        last = np.ones(len(c), dtype=bool)
        last[:-1] = c[1:] != c[:-1]
        return c[last], rt[last]

    def launch_rows(self, rows: np.ndarray) -> np.ndarray:
        """For device rows, the runtime call (cudaLaunchKernel...) that launched each (same
        correlation id), -1 where none did. A device row that starts before the call that would have
        launched it began is not that call's (a reused or corrupt id): -1. Vectorised: a trace has
        10^4..10^5 of them."""
        keys, launch = self._launch_index
        rows = np.asarray(rows, dtype=np.int64)
        corr = self.t.corr[rows]
        if not len(keys):
            return np.full(len(corr), -1, dtype=np.int64)
        i = np.minimum(keys.searchsorted(corr), len(keys) - 1)
        found = np.where((keys[i] == corr) & (corr >= 0), launch[i], -1)
        # one timer tick of slack: host and device times are rounded to the microsecond apart
        causal = self.t.ts[rows] >= self.t.ts[np.maximum(found, 0)] - 1.0
        return np.where(causal, found, -1)

    def launch_times(self, rows: np.ndarray) -> np.ndarray:
        """Host time of each device row's launch, NaN where it has none."""
        lr = self.launch_rows(rows)
        out = np.full(len(lr), np.nan)
        ok = lr >= 0
        out[ok] = self.t.ts[lr[ok]]
        return out

    # -- generic lookups ----------------------------------------------
    def rows_prefix(self, prefix: str | tuple[str, ...], cat=None) -> np.ndarray:
        return self.t.rows_with_prefix(prefix, cat=cat)

    def set_of(self, rows: np.ndarray) -> np.ndarray:
        return iv.as_set(self.t.ts[rows], self.end[rows])

    @cached_property
    def dataloader_rows(self) -> np.ndarray:
        rows = self.t.rows_named(lambda n: DATALOADER_RE.match(n) is not None, cat=(ANNOTATION, CPU_OP))
        return rows[self.t.track[rows] == self.main_track] if len(rows) else rows

    @cached_property
    def dataloader_set(self) -> np.ndarray:
        return self.set_of(self.dataloader_rows)

    @cached_property
    def optimizer_rows(self) -> np.ndarray:
        return self.rows_prefix(OPTIMIZER_PREFIX, (ANNOTATION, CPU_OP))

    @cached_property
    def optimizer_set(self) -> np.ndarray:
        """The optimizer's own work: ``Optimizer.step`` spans less the closures they call
        (``optimizer.step(closure)``: Lightning, the HF Trainer's closure optimizers, LBFGS), whose
        forward and backward are the model's compute, not the update."""
        return iv.subtract(self.set_of(self.optimizer_rows), self.closure_set)

    @cached_property
    def forward_starts(self) -> np.ndarray:
        """Sorted starts of module forwards and zero_grad calls: where a closure's work can begin."""
        fwd = self.rows_prefix(FORWARD_FRAME_PREFIX, PYFUNC)
        ann = self.rows_prefix(FORWARD_ANNOTATIONS + (ZERO_GRAD_PREFIX,), (ANNOTATION, CPU_OP))
        return np.sort(self.t.ts[np.concatenate([fwd, ann])].astype(np.float64))

    @cached_property
    def closure_set(self) -> np.ndarray:
        """Closure calls inside ``Optimizer.step`` spans: each backward pass inside a step span with the
        forward before it. A closure's work starts at the first module forward (or zero_grad) after the
        previous backward (the span's start when the trace names none: then an LBFGS line search's own
        arithmetic before a later closure call is counted with that closure's forward) and ends where its
        backward ends (the last backward op before the next forward, or the span's end)."""
        spans = self.set_of(self.optimizer_rows)
        bwd = self.backward_set
        if not len(spans) or not len(bwd):
            return iv.EMPTY
        fs = self.forward_starts
        out = []
        for a, b in spans:
            inside = iv.clip(bwd, a, b)
            pos = a
            while len(inside):
                s0 = inside[0, 0]
                k = fs.searchsorted(pos, "left")
                start = fs[k] if k < len(fs) and fs[k] <= s0 else pos
                k = fs.searchsorted(s0, "right")
                nxt = fs[k] if k < len(fs) and fs[k] < b else b
                last = inside[:, 0].searchsorted(nxt, "left")   # backward ops starting before it
                end = float(inside[max(last - 1, 0), 1])
                out.append((start, end))
                inside = inside[max(last, 1):]
                pos = end
        return iv.as_set([s for s, _ in out], [e for _, e in out])

    @cached_property
    def backward_set(self) -> np.ndarray:
        rows = self.rows_prefix(BACKWARD_MARKERS, (CPU_OP, ANNOTATION))
        sets = [self.set_of(rows)]
        run_bwd = self.rows_prefix("<built-in method run_backward", PYFUNC)
        if len(run_bwd):
            sets.append(self.set_of(run_bwd))
        return iv.union(*sets)

    def phase_at(self, t: float, step_end: float | None = None) -> str:
        """The phase whose work runs at ``t``: the autograd engine's (backward) wherever it was called
        from, the optimizer's own update, else forward when a backward follows in the step."""
        if iv.contains(self.backward_set, t):
            return "backward"
        if iv.contains(self.optimizer_set, t):
            return "optimizer"
        # forward if a backward follows within this step, else "other"
        b = self.backward_set
        if len(b) == 0:
            return "forward"
        k = b[:, 0].searchsorted(t, side="right")
        if k < len(b) and (step_end is None or b[k, 0] <= step_end):
            return "forward"
        return "other"

    # -- annotations enclosing an event -------------------------------
    def enclosing(self, rows: np.ndarray, track: int, t: float) -> int | None:
        """Innermost (latest-starting) row among ``rows`` on ``track`` that contains time ``t``; of
        rows starting at the same time, the first in ``rows``."""
        if len(rows) == 0:
            return None
        if len(rows) < _INDEX_MIN_ROWS:
            sel = rows[(self.t.track[rows] == track) & (self.t.ts[rows] <= t) & (self.end[rows] >= t)]
            if len(sel) == 0:
                return None
            return int(sel[np.argmax(self.t.ts[sel])])
        got = self._by_track.get(id(rows))
        if got is None or got[0] is not rows:  # rows on one track, by start: built once per rows array
            tr = self.t.track[rows]
            order = np.lexsort((self.t.ts[rows], tr))
            tracks = tr[order]
            got = self._by_track[id(rows)] = (rows, rows[order], tracks, self.t.ts[rows][order],
                                              self.end[rows][order])
        _, srows, tracks, starts, ends = got
        lo, hi = tracks.searchsorted(track, "left"), tracks.searchsorted(track, "right")
        k = lo + int(starts[lo:hi].searchsorted(t, "right"))  # rows of the track starting at or before t
        # the latest of them still running at t: look back in growing chunks (nested frames are near k)
        stop, width = k, 32
        while stop > lo:
            begin = max(lo, stop - width)
            hit = np.nonzero(ends[begin:stop] >= t)[0]
            if len(hit):
                j = begin + int(hit[-1])
                # rows starting at that same time: the first of them (in rows order) that holds t
                first = lo + int(starts[lo:hi].searchsorted(starts[j], "left"))
                # (lexsort is stable: rows that start together keep their order in ``rows``)
                return int(srows[first + int(np.nonzero(ends[first:j + 1] >= t)[0][0])])
            stop, width = begin, width * 4
        return None

    # -- python stacks -------------------------------------------------
    @cached_property
    def _user_frames(self):
        ids = self.t.ids_of(is_user_frame)
        if len(ids) == 0:
            return None
        rows = np.nonzero(np.isin(self.t.name_id, ids) & (self.t.cat == PYFUNC))[0]
        return rows

    def source_line(self, track: int, t: float) -> str | None:
        """The innermost user-code Python frame on ``track`` running at time ``t``."""
        rows = self._user_frames
        if rows is None:
            return None
        r = self.enclosing(rows, track, t)
        return self.t.name(r) if r is not None else None

    def frames_named(self, prefix: str) -> np.ndarray:
        return self.rows_prefix(prefix, PYFUNC)

    # -- host syncs ----------------------------------------------------
    @cached_property
    def sync_rows(self) -> np.ndarray:
        rows = self.t.rows_named(lambda n: n in SYNC_NAMES, cat=(CPU_OP, RUNTIME))
        return rows

    @cached_property
    def device_rows(self) -> np.ndarray:
        """Every kernel, copy and memset on this rank's device (the rows of the device timeline)."""
        return np.nonzero(np.isin(self.t.cat, DEVICE_CATEGORIES))[0]

    @cached_property
    def stack_starts(self) -> np.ndarray:
        """Start of every Python frame recorded on the compute threads (with_stack), sorted: the profiler's
        own cost is counted per frame (analysis/gpu_idle.py, signals.host_syncs)."""
        t = self.t
        return np.sort(t.ts[(t.cat == PYFUNC) & np.isin(t.track, self.compute_tracks)])

    @cached_property
    def host_event_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """Start of every torch op and of every CUDA runtime call on the compute threads, each sorted: the
        profiler's own cost is counted per event where a saving is host time (signals.host_syncs)."""
        t = self.t
        host = np.isin(t.track, self.compute_tracks)
        return np.sort(t.ts[(t.cat == CPU_OP) & host]), np.sort(t.ts[(t.cat == RUNTIME) & host])

    def sync_reach(self, rows: np.ndarray) -> np.ndarray:
        """How far past its return each sync in ``rows`` can have kept the device idle: as long as the host
        was blocked in it. Without the sync the host would have queued the next kernels that much earlier
        and no more, so every idle instant in that span is the sync's, not only the gap before the device
        runs its next kernel: after a drained queue the device runs each kernel as it is launched and idles
        between launches until the host is ahead again (the H200 pair traces/cuda/pairs/cuda_host_sync:
        about 1 ms of such idle per step, 0.2 ms of it before the first kernel). A sync that returns at
        once found the queue empty already: it reaches nowhere, and the idle after it is the host
        launching."""
        t = self.t
        return t.ts[rows] + 2 * t.dur[rows]

    @cached_property
    def wait_set(self) -> np.ndarray:
        """Python ``Work.wait()`` frames on the compute threads: the host blocked on a collective."""
        rows = self.frames_named("<built-in method wait of")
        if not len(rows):
            return iv.EMPTY
        return self.set_of(rows[np.isin(self.t.track[rows], self.compute_tracks)])

    @cached_property
    def sleep_rows(self) -> np.ndarray:
        rows = self.frames_named("<built-in function sleep>")
        return rows[self.t.track[rows] == self.main_track] if len(rows) else rows


# below this many rows, one vectorised test of every row is cheaper than building an index
_INDEX_MIN_ROWS = 256

