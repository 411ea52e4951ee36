"""The capture wrapper: torch.profiler on a wait/warmup/active schedule, one
gzipped chrome trace per profiled rank, and ``manifest.json`` from the lowest
profiled rank.

Guarantees:

* It never raises into the training job once constructed: failures in
  creating the folder, starting the profiler, exporting the trace or writing
  the manifest become one ``RuntimeWarning`` (``fsdpdoctor.capture: ...``),
  and training goes on.
* Ranks not in ``ranks`` run no profiler at all.
* Once the schedule is complete the profiler is stopped and dropped:
  ``step()`` is then a counter increment.
* It runs no collective: hosts and devices for the manifest are exchanged
  through the process group's key-value store (each rank sets its own key at
  start; the manifest rank reads them, waiting at most ``HOST_WAIT_S`` in
  all for a rank that has not set its key). A rank that never enters the
  capture, dies, or runs without a process group leaves ``null`` there; no
  rank ever waits on another because of the capture.

With ``repeat != 1`` every cycle is kept: the first as ``rank<N>.json.gz``, cycle
k as ``rank<N>.cycle<k>.json.gz`` (listed in the manifest's ``cycle_files``);
the loader joins a rank's cycles into one table, and ``profiled_steps`` lists
the steps of every cycle.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import functools
import json
import os
import platform
import socket
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

from fsdpdoctor.capture.watch import Watch as _Watch
from fsdpdoctor.capture.manifest import BWD_MARK, FWD_MARK, describe_model, describe_wrapping


def _warn(msg: str) -> None:
    warnings.warn(f"fsdpdoctor.capture: {msg}", RuntimeWarning, stacklevel=3)


# With with_stack=True, torch.profiler's Python tracer reads ``.grad`` of the parameters
# of every module it sees called. FSDP1 with use_orig_params=True keeps the original
# parameters as views of its flat parameter (non-leaf tensors), so that read makes torch
# warn "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed" once
# per rank: a warning the job does not give without the capture. It is silenced, for
# exactly that message, only while this capture's profiler runs.
_TRACER_GRAD_WARNING = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"


def _silence_tracer_grad_warning() -> tuple:
    warnings.filterwarnings("ignore", message=_TRACER_GRAD_WARNING, category=UserWarning)
    return warnings.filters[0]


def _restore_warning_filter(entry) -> None:
    try:
        warnings.filters.remove(entry)
        warnings._filters_mutated()  # type: ignore[attr-defined]  # invalidate the once-per-location cache
    except (ValueError, AttributeError):
        pass


def track_fsdp2_prefetch_calls() -> bool:
    """Record explicit FSDP2 ``set_modules_to_{forward,backward}_prefetch`` calls.

    ``set_modules_to_backward_prefetch([])`` leaves the module state exactly as
    if it had never been called (an empty list, which FSDP2 treats as "use the
    default prefetch"), so the manifest can only report such a call if it was
    recorded. Call this before configuring the model; idempotent. Returns False
    when FSDP2 is not available.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:
        return False
    if getattr(FSDPModule, "_fsdpdoctor_tracked", False):
        return True

    def wrap(name: str, mark: str):
        orig = getattr(FSDPModule, name, None)
        if orig is None:
            return

        @functools.wraps(orig)
        def patched(self, modules, *args, **kwargs):
            result = orig(self, modules, *args, **kwargs)
            try:
                setattr(self._get_fsdp_state(), mark, True)
            except Exception:
                pass
            return result

        setattr(FSDPModule, name, patched)

    wrap("set_modules_to_backward_prefetch", BWD_MARK)
    wrap("set_modules_to_forward_prefetch", FWD_MARK)
    FSDPModule._fsdpdoctor_tracked = True
    return True


# Longest the manifest rank waits, in all, for ranks that have not published their host yet
# (ranks publish at start, long before the manifest is written after the profiled window).
HOST_WAIT_S = 2.0


def _default_store():
    """The default process group's key-value store (private torch API), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _rank_world() -> tuple[int, int, bool]:
    """(rank, world_size, has_process_group)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), True
    except Exception:
        pass
    # No process group: a plain process is rank 0 of 1; under a launcher without
    # a process group use the launcher's numbering so files do not collide.
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), False
    except ValueError:
        return 0, 1, False


def _device_of(model) -> str:
    import torch

    dev = None
    if model is not None:
        for p in model.parameters():
            dev = p.device
            break
    if dev is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            dev = torch.device("cuda", torch.cuda.current_device())
        else:
            dev = torch.device("cpu")
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        try:
            return f"cuda:{idx} ({torch.cuda.get_device_name(idx)})"
        except Exception:
            return f"cuda:{idx}"
    return str(dev)


class Capture:
    """See :func:`capture`."""

    def __init__(self, out_dir, *, model=None, optimizer=None, wait: int = 1, warmup: int = 1,
                 active: int = 3, repeat: int = 1, skip_first: int = 0,
                 ranks: Iterable[int] | None = None, with_stack: bool = True,
                 record_shapes: bool = True, profile_memory: bool = False,
                 samples_per_step: int | None = None, tokens_per_step: int | None = None,
                 scenario: dict | None = None, hang_timeout_s: float | None = None):
        if min(wait, warmup, skip_first) < 0 or active < 1 or repeat < 0:
            raise ValueError("capture: need wait, warmup, skip_first >= 0, active >= 1, repeat >= 0")
        self.out_dir = Path(out_dir)
        self.model = model
        self.optimizer = optimizer
        self.wait, self.warmup, self.active = int(wait), int(warmup), int(active)
        self.repeat, self.skip_first = int(repeat), int(skip_first)
        self.ranks = None if ranks is None else sorted({int(r) for r in ranks})
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.samples_per_step = samples_per_step
        self.tokens_per_step = tokens_per_step
        self.scenario = scenario
        # hang watchdog (fsdpdoctor.capture.watch), every rank, off unless hang_timeout_s is given
        self._watch = _Watch(self.out_dir, hang_timeout_s) if hang_timeout_s else None

        self.rank, self.world_size = 0, 1
        self.step_num = 0          # number of step() calls so far
        self.profiling = False     # this rank runs a profiler (now or earlier)
        self.exported = False      # this rank wrote its trace at least once
        self.cycles_exported = 0   # profiler cycles written by this rank
        self.manifest_written = False
        self._prof = None
        self._warning_filter = None
        self._started = False
        self._finished = False
        self._has_pg = False
        self._store = None
        self._hosts: dict[str, str] = {}
        self._devices: dict[str, str] = {}
        cycle = self.wait + self.warmup + self.active
        self._total_steps = self.skip_first + self.repeat * cycle if self.repeat > 0 else None

    # ------------------------------------------------------------------ schedule
    @property
    def profiled_ranks(self) -> list[int]:
        if self.ranks is None:
            return list(range(self.world_size))
        return [r for r in self.ranks if 0 <= r < self.world_size]

    @property
    def manifest_rank(self) -> int | None:
        pr = self.profiled_ranks
        return pr[0] if pr else None

    def profiled_steps(self) -> list[int]:
        """Steps (ProfilerStep#N numbers) of every complete or current active window."""
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0:
            last = self.repeat - 1
        else:  # repeat forever: every cycle that started
            last = max(0, (self.step_num - self.skip_first) // cycle)
        steps = []
        for k in range(last + 1):
            start = self.skip_first + k * cycle + self.wait + self.warmup
            steps += range(start, start + self.active)
        if not self._finished:
            steps = [s for s in steps if s < self.step_num]
        return steps

    def _file_name(self, rank: int, cycle: int) -> str:
        return f"rank{rank}.json.gz" if cycle <= 1 else f"rank{rank}.cycle{cycle}.json.gz"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Capture":
        if self._started:
            return self
        self._started = True
        if self._watch is not None:
            self._watch.start()
        try:
            self.rank, self.world_size, self._has_pg = _rank_world()
        except Exception as exc:  # pragma: no cover
            _warn(f"cannot determine rank ({exc}); assuming rank 0 of 1")
        self._gather_hosts()
        if self.ranks is not None and self.rank not in self.ranks:
            return self  # not profiled: no profiler at all
        track_fsdp2_prefetch_calls()
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot create {self.out_dir} ({exc}); not profiling")
            return self
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile, schedule

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._prof = profile(
                activities=activities,
                schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                                  repeat=self.repeat, skip_first=self.skip_first),
                on_trace_ready=self._on_trace_ready,
                record_shapes=self.record_shapes,
                with_stack=self.with_stack,
                profile_memory=self.profile_memory,
            )
            if self.with_stack:
                self._warning_filter = _silence_tracer_grad_warning()
            self._prof.start()
            self.profiling = True
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot start torch.profiler ({exc}); not profiling")
            self._prof = None
            self._unsilence()
        return self

    def step(self) -> None:
        """Mark the end of one training step."""
        self.step_num += 1
        if self._watch is not None:
            self._watch.step()
        if self._prof is not None:
            try:
                self._prof.step()
            except Exception as exc:
                _warn(f"rank {self.rank}: profiler step failed ({exc}); profiling stopped")
                self._stop_profiler()
                return
            if self._total_steps is not None and self.step_num >= self._total_steps:
                self._finished = True
                self._stop_profiler()
                self._write_manifest_if_mine()

    def close(self) -> None:
        """Stop profiling (exporting a partial window) and write the manifest. Idempotent."""
        if not self._started:
            return
        self._stop_profiler()
        self._write_manifest_if_mine()
        if self._watch is not None:
            self._watch.close()

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._watch is not None:
            self._watch.__exit__(exc_type, exc, tb)  # an aborting job dumps too
        self.close()
        return False

    def __call__(self, fn: Callable) -> Callable:
        """Decorator: every call of ``fn`` is one step."""

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not self._started:
                self.start()
                atexit.register(self.close)
            try:
                return fn(*args, **kwargs)
            finally:
                self.step()

        wrapper.capture = self  # type: ignore[attr-defined]
        return wrapper

    # ------------------------------------------------------------------ internals
    def _unsilence(self) -> None:
        entry, self._warning_filter = self._warning_filter, None
        if entry is not None:
            _restore_warning_filter(entry)

    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        try:
            prof.stop()  # exports a window still being recorded (on_trace_ready)
        except Exception as exc:
            _warn(f"rank {self.rank}: stopping the profiler failed ({exc})")
        finally:
            self._unsilence()

    def _on_trace_ready(self, prof) -> None:
        self.cycles_exported += 1
        path = self.out_dir / self._file_name(self.rank, self.cycles_exported)
        tmp = self.out_dir / f".rank{self.rank}.partial.json.gz"
        try:
            # torch gzips when the path ends in .gz; rename so readers never see half a file
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, path)
            self.exported = True
            self._summarize_in_background(path)
        except BaseException as exc:
            # no half-written file is left behind, also when Ctrl-C lands inside the export
            try:
                tmp.unlink()
            except Exception:
                pass
            if not isinstance(exc, Exception):
                raise
            _warn(f"rank {self.rank}: cannot write trace {path} ({exc}); training continues")

    def _store_key(self, rank: int) -> str:
        return f"fsdpdoctor.capture/{os.path.abspath(self.out_dir)}/host/{rank}"

    # Each exported trace gets its rank<N>.summary.msgpack from a separate, niced process, so that
    # `fsdpdoctor analyze` on the folder reads summaries, not traces. Never on the training thread,
    # never an error in the job. Set to False (or FSDPDOCTOR_NO_SUMMARY=1) to skip.
    write_summaries = True

    def _summarize_in_background(self, path: Path) -> None:
        if not self.write_summaries or os.environ.get("FSDPDOCTOR_NO_SUMMARY"):
            return
        import subprocess
        import sys

        try:
            if not hasattr(self, "_param_dtype"):
                self._param_dtype = describe_model(self.model).get("param_dtype") if self.model is not None else None
            argv = ["summarize", str(path), "--quiet", "--no-progress", "--jobs", "1"]
            if self._param_dtype:
                argv += ["--param-dtype", str(self._param_dtype)]
            # the child imports this very fsdpdoctor: ``-c`` would put the job's working folder first on
            # the path, where a folder named fsdpdoctor (a checkout) would be imported instead
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            code = (f"import os,sys; sys.path[:] = [{root!r}] + [p for p in sys.path if p not in ('', '.')]; "
                    f"os.nice(10); from fsdpdoctor.cli import main; sys.exit(main({argv!r}))")
            subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot start the trace summary ({exc}); `fsdpdoctor summarize` builds it later")

    def _gather_hosts(self) -> None:
        """Publish this rank's (host, device); see the module docstring."""
        host = socket.gethostname()
        try:
            device = _device_of(self.model)
        except Exception:
            device = None
        self._hosts[str(self.rank)], self._devices[str(self.rank)] = host, device
        self._store = _default_store() if self._has_pg else None
        if self._store is not None:
            try:
                self._store.set(self._store_key(self.rank), json.dumps([host, device]))
            except Exception as exc:
                _warn(f"rank {self.rank}: cannot publish host/device ({exc})")
                self._store = None

    def _collect_hosts(self) -> None:
        """Read the other ranks' (host, device) from the store, waiting at most HOST_WAIT_S in all."""
        if self._store is None:
            return
        deadline = time.monotonic() + HOST_WAIT_S
        for r in range(self.world_size):
            if str(r) in self._hosts:
                continue
            key = self._store_key(r)
            try:
                while not self._store.check([key]):
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
                else:
                    self._hosts[str(r)], self._devices[str(r)] = json.loads(self._store.get(key))
            except Exception:
                continue

    def manifest(self) -> dict:
        import torch

        try:
            import torch.distributed as dist

            backend = dist.get_backend() if self._has_pg else None
        except Exception:
            backend = None
        nccl = None
        try:
            if torch.cuda.is_available():
                v = torch.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        from fsdpdoctor import __version__

        pr = self.profiled_ranks
        self._collect_hosts()
        try:
            wrapping = describe_wrapping(self.model)
        except Exception as exc:
            _warn(f"cannot describe the model wrapping ({exc})")
            wrapping = {"kind": None}
        try:
            model = describe_model(self.model, self.optimizer)
        except Exception as exc:
            _warn(f"cannot describe the model ({exc})")
            model = describe_model(None, self.optimizer)
        return {
            "fsdpdoctor_manifest": 1,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "world_size": self.world_size,
            "backend": backend,
            "profiled_ranks": pr,
            "files": {str(r): f"rank{r}.json.gz" for r in pr},
            # every profiler cycle's file per rank, in order (the first is "files"); the manifest rank
            # writes this after its own exports, and all ranks run the same schedule
            "cycle_files": {str(r): [self._file_name(r, k) for k in range(1, max(self.cycles_exported, 1) + 1)] for r in pr},
            "versions": {"torch": torch.__version__.split("+")[0], "cuda": torch.version.cuda,
                         "nccl": nccl, "python": platform.python_version(), "fsdpdoctor": __version__},
            "hosts": {str(r): self._hosts.get(str(r)) for r in range(self.world_size)},
            "devices": {str(r): self._devices.get(str(r)) for r in range(self.world_size)},
            "schedule": {"skip_first": self.skip_first, "wait": self.wait, "warmup": self.warmup,
                         "active": self.active, "repeat": self.repeat},
            "profiled_steps": self.profiled_steps(),
            "samples_per_step": self.samples_per_step,
            "tokens_per_step": self.tokens_per_step,
            "options": {"record_shapes": self.record_shapes, "with_stack": self.with_stack,
                        "profile_memory": self.profile_memory},
            "model": model,
            "wrapping": wrapping,
            "scenario": self.scenario,
        }

    def _write_manifest_if_mine(self) -> None:
        if self.manifest_written or self.rank != self.manifest_rank:
            return
        self.manifest_written = True
        path = self.out_dir / "manifest.json"
        try:
            data = self.manifest()
            self.out_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.out_dir / ".manifest.partial.json"
            try:
                tmp.write_text(json.dumps(data, indent=2) + "\n")
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot write {path} ({exc}); training continues")


def capture(out_dir, *, model=None, optimizer=None, wait: int = 1, warmup: int = 1, active: int = 3,
            repeat: int = 1, skip_first: int = 0, ranks: Iterable[int] | None = None,
            with_stack: bool = True, record_shapes: bool = True, profile_memory: bool = False,
            samples_per_step: int | None = None, tokens_per_step: int | None = None,
            scenario: dict | None = None, hang_timeout_s: float | None = None) -> Capture:
    """Profile a training loop into ``out_dir`` (one ``rank<N>.json.gz`` per profiled rank
    plus ``manifest.json``).

    Use as a context manager (call ``.step()`` once per training step) or as a
    decorator on the step function. ``ranks=None`` profiles all ranks. The
    schedule is torch.profiler's: ``skip_first`` steps, then ``repeat`` cycles of
    ``wait`` + ``warmup`` + ``active`` steps. ``samples_per_step`` and
    ``tokens_per_step`` are global (summed over ranks) per optimizer step.
    ``hang_timeout_s=N`` also starts the hang watchdog (``fsdpdoctor.capture.watch``): with no
    ``step()`` for N seconds every rank writes ``hang/rank<N>.json`` (docs/hang.md).
    """
    return Capture(out_dir, model=model, optimizer=optimizer, wait=wait, warmup=warmup,
                   active=active, repeat=repeat, skip_first=skip_first, ranks=ranks,
                   with_stack=with_stack, record_shapes=record_shapes,
                   profile_memory=profile_memory, samples_per_step=samples_per_step,
                   tokens_per_step=tokens_per_step, scenario=scenario, hang_timeout_s=hang_timeout_s)
