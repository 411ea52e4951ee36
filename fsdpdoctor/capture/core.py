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
import contextlib
import datetime as _dt
import functools
import json
import os
import platform
import signal
import socket
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable, Iterable

from fsdpdoctor.capture import series as _series
from fsdpdoctor.capture import windows as _win
from fsdpdoctor.capture.watch import Watch as _Watch
from fsdpdoctor.capture.grads import GradPresence
from fsdpdoctor.capture.manifest import BWD_MARK, FWD_MARK, describe_model, describe_wrapping

_now_ns = time.perf_counter_ns
_POLL_NS = int(_win.POLL_S * 1e9)
# Above this, an automatic window is not opened: window folders of this run already hold this much.
MAX_WINDOW_BYTES = 2 << 30


def _warn(msg: str) -> None:
    warnings.warn(f"fsdpdoctor.capture: {msg}", RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def _sigint_held():
    """Hold Ctrl-C while a trace is written: torchrun delivers a second SIGINT to the ranks, which
    would land inside the export and leave no trace. Yields the list of signals held (main thread only)."""
    held: list[int] = []
    old = None
    if threading.current_thread() is threading.main_thread():
        try:
            old = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
        except (ValueError, OSError, TypeError):
            old = None
    try:
        yield held
    finally:
        if old is not None:
            try:
                signal.signal(signal.SIGINT, old)
            except (ValueError, OSError, TypeError):
                pass


def _folder_bytes(folders: list[Path]) -> int:
    total = 0
    for d in folders:
        try:
            with os.scandir(d) as it:
                total += sum(e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False))
        except OSError:
            pass
    return total


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
# A rank other than the coordinator buffers its step series until it knows the job's folder, at most this long.
FOLDER_WAIT_S = 10.0


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
                 scenario: dict | None = None, hang_timeout_s: float | None = None,
                 fixed_window: bool = True, auto: bool = False, window_steps: int = 3,
                 max_windows: int = 5, max_window_bytes: int = MAX_WINDOW_BYTES,
                 cooldown_steps: int | None = None, min_rise: float = _win.MIN_RISE):
        if min(wait, warmup, skip_first) < 0 or active < 1 or repeat < 0:
            raise ValueError("capture: need wait, warmup, skip_first >= 0, active >= 1, repeat >= 0")
        if (not 1 <= window_steps <= _win.MAX_WINDOW_STEPS or max_windows < 0 or max_window_bytes < 0
                or not min_rise >= 0):
            raise ValueError(f"capture: need 1 <= window_steps <= {_win.MAX_WINDOW_STEPS}, max_windows >= 0, "
                             "max_window_bytes >= 0, min_rise >= 0")
        self.fixed_window = bool(fixed_window)
        self.auto = bool(auto)
        self.window_steps = int(window_steps)
        self.max_windows = int(max_windows)
        self.max_window_bytes = int(max_window_bytes)
        # after a window, the rule needs a fresh reference of healthy steps before it can judge again
        self.cooldown_steps = int(cooldown_steps) if cooldown_steps is not None else 2 * _win.REFERENCE_STEPS
        self.out_dir = Path(out_dir)
        # the ranks' store keys name the folder as the job gave it (the coordinator may move it, see _arm)
        self._key_dir = os.path.abspath(self.out_dir)
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
        self._grads = GradPresence.of(model)  # per-parameter gradients in profiled steps (DDP models)

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
        self._partial_step: int | None = None   # the step the fixed window's profiler cut (close() inside it)
        # armed for the whole run: the step series and the windows (docs/capture.md)
        self._job = uuid.uuid4().hex
        self._origin_ns = 0          # clock reading at start(): the series' origin
        self._ends: list[int] = []   # clock readings at the end of the steps not yet written
        self._prev_end = 0           # end of the last written step (or the origin)
        self._written = 0            # steps written to the series
        self._waits_us: dict[int, int] = {}   # step -> time waiting for its batch (see batches())
        self._series: _series.SeriesWriter | None = None
        self._next_poll = 1 << 62    # clock reading of the next poll (never before start())
        self._folder_known = True    # False until a non-coordinator rank learned the folder of this job
        self._board: _win.Board | None = None
        self._rule = _win.AnomalyRule(float(min_rise)) if self.auto else None
        self._seq = 0                # plans seen
        self._plan: _win.Plan | None = None
        self._window_at = -1         # step_num at which the planned window's warm-up step begins
        self._wprof = None
        self._wexported = False
        self._windows: list[dict] = []   # windows this rank took part in
        self._quiet_until = 0        # no automatic window before this step (cool-down)
        self._warned: set[str] = set()
        self._windows_planned: list[_win.Plan] = []   # the coordinator's plans (caps on windows and disk)
        self._feed_from = 0          # first step the anomaly rule may judge
        self._origin_unix_ns = 0

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

    def _in_fixed_window(self, step: int) -> bool:
        """Whether ``step`` is an active step of the fixed schedule."""
        cycle = self.wait + self.warmup + self.active
        k = step - self.skip_first
        return (self.fixed_window and k >= 0 and k % cycle >= self.wait + self.warmup
                and (self.repeat == 0 or k // cycle < self.repeat))

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
        try:
            self.rank, self.world_size, self._has_pg = _rank_world()
        except Exception as exc:  # pragma: no cover
            _warn(f"rank {self.rank}: cannot determine rank ({exc}); assuming rank 0 of 1")
        self._gather_hosts()
        self._arm()
        if self._watch is not None:
            self._watch.out_dir = self.out_dir  # the folder this job writes to (see _arm)
            self._watch.start()
        if self.ranks is not None and self.rank not in self.ranks:
            return self  # not profiled: no profiler at all
        track_fsdp2_prefetch_calls()
        if not self.fixed_window:
            return self
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot create {self.out_dir} ({exc}); not profiling")
            return self
        try:
            from torch.profiler import schedule

            self._prof = self._new_profiler(
                schedule(wait=self.wait, warmup=self.warmup, active=self.active,
                         repeat=self.repeat, skip_first=self.skip_first), self._on_trace_ready)
            self._prof.start()
            self.profiling = True
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot start torch.profiler ({exc}); not profiling")
            self._prof = None
            self._unsilence()
        return self

    def step(self) -> None:
        """Mark the end of one training step."""
        now = _now_ns()
        self._ends.append(now)
        if self._grads is not None:
            self._grads.end_step(self._in_fixed_window(self.step_num))
        self.step_num += 1
        if self._watch is not None:
            self._watch.step()
        if self._prof is not None:
            self._fixed_step()
        if self._wprof is not None:
            self._window_step()
        if now >= self._next_poll:
            self._poll(now)
        if self.step_num == self._window_at:
            self._open_window()

    def batches(self, iterable):
        """Yield from ``iterable``, recording the time each step waits for its batch in the step series."""
        it = iter(iterable)
        while True:
            t0 = _now_ns()
            try:
                item = next(it)
            except StopIteration:
                return
            k = self.step_num
            self._waits_us[k] = self._waits_us.get(k, 0) + (_now_ns() - t0) // 1000
            yield item

    def close(self) -> None:
        """Stop profiling (exporting a partial window), write the manifest and the rest of the step
        series. Idempotent."""
        if not self._started or self._closed:
            return
        self._closed = True
        try:
            self._stop_profiler(cut=True)
            self._write_manifest_if_mine()
            if self._wprof is not None or self._plan is not None:
                self._end_window(cut=True)
            self._next_poll = 1 << 62
            self._flush()
        except Exception as exc:
            _warn(f"rank {self.rank}: closing the capture failed ({exc})")
        finally:
            if self._series is not None:
                self._series.close()
            if self.rank == 0:
                _win.release_claim(self.out_dir, self._job)
                if self._board is not None:
                    self._board.clear(self._seq)
            if self._watch is not None:
                self._watch.close()
        self._raise_held_interrupt()

    def __enter__(self) -> "Capture":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        # an exception is already ending the job: a second Ctrl-C during the export is not raised again
        self._exiting = exc_type is not None
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
    _closed = False
    _exiting = False
    _interrupt_held = False

    def _raise_held_interrupt(self) -> None:
        """A Ctrl-C held during an export is delivered now, unless the job is already ending."""
        if self._interrupt_held and not self._exiting:
            self._interrupt_held = False
            raise KeyboardInterrupt

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _warn(f"rank {self.rank}: {msg}")

    def _new_profiler(self, sched, on_ready):
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities, schedule=sched, on_trace_ready=on_ready,
                       record_shapes=self.record_shapes, with_stack=self.with_stack,
                       profile_memory=self.profile_memory)
        if self.with_stack and self._warning_filter is None:
            self._warning_filter = _silence_tracer_grad_warning()
        return prof

    def _fixed_step(self) -> None:
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
        self._raise_held_interrupt()

    def _unsilence(self) -> None:
        entry, self._warning_filter = self._warning_filter, None
        if entry is not None:
            _restore_warning_filter(entry)

    def _cut_step(self) -> int | None:
        """The fixed schedule's step in progress now when it is an active (recorded) step."""
        s, cycle = self.step_num, self.wait + self.warmup + self.active
        if self._finished or s < self.skip_first:
            return None
        k, pos = divmod(s - self.skip_first, cycle)
        if (self.repeat == 0 or k < self.repeat) and pos >= self.wait + self.warmup:
            return s
        return None

    def _stop_profiler(self, cut: bool = False) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        if cut:
            self._partial_step = self._cut_step()
        try:
            with _sigint_held() as held:
                prof.stop()  # exports a window still being recorded (on_trace_ready)
            self._interrupt_held |= bool(held)
        except Exception as exc:
            _warn(f"rank {self.rank}: stopping the profiler failed ({exc})")
        finally:
            self._unsilence()

    def _export(self, prof, path: Path) -> bool:
        """Write ``prof``'s trace to ``path`` through a temp name of this writer (two jobs writing into one
        folder never share one), holding Ctrl-C meanwhile; no temp file is left behind on any failure."""
        tmp = path.with_name(f".{path.name.split('.')[0]}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial.json.gz")
        with _sigint_held() as held:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                # torch gzips when the path ends in .gz; rename so readers never see half a file
                prof.export_chrome_trace(str(tmp))
                os.replace(tmp, path)
                ok = True
            except BaseException as exc:
                try:
                    tmp.unlink()
                except Exception:
                    pass
                if not isinstance(exc, Exception):
                    raise
                _warn(f"rank {self.rank}: cannot write trace {path} ({exc}); training continues")
                ok = False
        self._interrupt_held |= bool(held)
        if ok:
            self._summarize_in_background(path)
        return ok

    def _on_trace_ready(self, prof) -> None:
        self._learn_folder(wait=True)
        self.cycles_exported += 1
        if self._export(prof, self.out_dir / self._file_name(self.rank, self.cycles_exported)):
            self.exported = True

    # ------------------------------------------------------------------ armed: step series and windows
    def _folder_key(self) -> str:
        return f"fsdpdoctor.capture/{self._key_dir}/folder"

    def _arm(self) -> None:
        """Start the step series; the coordinator (rank 0) claims the run folder (docs/capture.md)."""
        self._origin_ns = self._prev_end = _now_ns()
        self._origin_unix_ns = time.time_ns()
        try:
            if self.rank == 0:
                folder, other = _win.claim_folder(self.out_dir, self._job, socket.gethostname())
                if folder != self.out_dir:
                    _warn(f"{self.out_dir} is in use by another running job (host {other.host}, pid {other.pid}); "
                          f"this job writes to {folder}")
                    self.out_dir = folder
                if self._store is not None:
                    self._store.set(self._folder_key(), str(self.out_dir))
            elif self._store is not None:
                self._folder_known = False
                self._learn_folder()
            self._board = _win.Board(self.out_dir if self._store is None else Path(self._key_dir), self._store)
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot claim {self.out_dir} ({exc}); writing there")
        self._next_poll = self._origin_ns + _POLL_NS

    def _learn_folder(self, wait: bool = False) -> None:
        """A rank other than the coordinator writes where the coordinator decided (the store's key);
        gives up after HOST_WAIT_S when asked to wait, or FOLDER_WAIT_S after start."""
        if self._folder_known:
            return
        deadline = time.monotonic() + (HOST_WAIT_S if wait else 0.0)
        while True:
            try:
                key = self._folder_key()
                if self._store.check([key]):
                    self.out_dir = Path(self._store.get(key).decode())
                    if self._watch is not None:
                        self._watch.out_dir = self.out_dir
                    self._folder_known = True
                    return
            except Exception:
                self._folder_known = True
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if wait or _now_ns() - self._origin_ns > FOLDER_WAIT_S * 1e9:
            self._folder_known = True   # no word from the coordinator: the folder as given

    def _poll(self, now: int) -> None:
        self._next_poll = now + _POLL_NS
        try:
            if not self._folder_known:
                self._learn_folder()
            first, durations = self._flush()
            if self.rank == 0:
                _win.refresh_claim(self.out_dir)
                self._coordinate(first, durations)
            elif self._plan is None:
                self._look_for_plan()
            plan = self._plan
            if plan is not None and self._wprof is None and self._window_at < 0 and self.step_num > plan.last:
                self._plan_done(plan)  # a plan this rank did not profile (not a profiled rank, or late)
        except Exception as exc:
            self._warn_once("poll", f"step series / windows failed ({type(exc).__name__}: {exc}); training continues")

    def _flush(self) -> tuple[int, list[float]]:
        """Write the steps completed since the last flush; returns (first step, their durations in s)."""
        ends, first = self._ends, self._written
        if not ends or not self._folder_known:
            return first, []
        self._ends = []
        prev = self._prev_end
        data = _series.encode_records(first, ends, prev, self._origin_ns, self._waits_us)
        durations = [(b - a) / 1e9 for a, b in zip([prev] + ends[:-1], ends)]
        self._prev_end, self._written = ends[-1], first + len(ends)
        if self._waits_us:
            self._waits_us = {k: v for k, v in self._waits_us.items() if k >= self._written}
        if self._series is None:
            self._series = _series.SeriesWriter(_series.series_path(self.out_dir, self.rank), self.rank,
                                                self.world_size, self._origin_unix_ns)
        if not self._series.append(data) and self._series.failed:
            self._warn_once("series", f"cannot write the step series ({self._series.failed}); training continues")
        return first, durations

    def _fixed_end(self) -> int | None:
        """First step after the fixed schedule (None: it never ends; 0: no fixed window)."""
        return self._total_steps if self.fixed_window else 0

    def _coordinate(self, first: int, durations: list[float]) -> None:
        if self._plan is not None:
            return
        fixed_end = self._fixed_end()
        reason = None
        request = self._read_trigger()
        if request is None and self._rule is not None and durations and fixed_end is not None:
            skip = max(0, max(fixed_end, self._feed_from) - first)
            if skip < len(durations):
                reason = self._rule.feed(first + skip, durations[skip:])
        if request is None and reason is None:
            return
        if fixed_end is None:
            self._warn_once("forever", "the fixed schedule repeats forever (repeat=0): no other window can open")
            return
        if request is None:
            if self.step_num < self._quiet_until:
                return
            if len(self._windows_planned) >= self.max_windows:
                self._warn_once("cap", f"anomaly not profiled, {self.max_windows} windows already ({reason})")
                return
            used = _folder_bytes([_win.window_dir(self.out_dir, p.first) for p in self._windows_planned])
            if used >= self.max_window_bytes:
                self._warn_once("disk", f"anomaly not profiled, the windows hold {used / 2**20:.0f} MiB ({reason})")
                return
        median = self._rule.ref.median if self._rule is not None and self._rule.ref else (
            sorted(durations)[len(durations) // 2] if durations else None)
        # alone, the coordinator needs no time to tell other ranks: the window starts after one warm-up step
        lead = _win.lead_steps(median) if self.world_size > 1 else 1
        start = max(self.step_num + lead, (fixed_end or 0) + 1)
        if request is not None:
            n, requested = request
            plan = _win.Plan(seq=self._seq + 1, first=start, steps=n, why="demand", requested=requested,
                             reason="requested with `fsdpdoctor trigger`" + (f" at {requested}" if requested else ""))
        else:
            plan = _win.Plan(seq=self._seq + 1, first=start, steps=self.window_steps, why="anomaly", reason=reason)
        if self.world_size > 1:
            self._board.publish(plan)
        self._seq = plan.seq
        self._windows_planned.append(plan)
        self._plan, self._window_at = plan, plan.first - 1

    def _read_trigger(self) -> tuple[int, str | None] | None:
        path = self.out_dir / _win.TRIGGER_NAME
        try:
            os.lstat(path)
        except OSError:
            return None
        n, requested, problem = _win.read_request(path)
        if problem is not None:
            rejected = path.with_name(path.name + _win.REJECTED_SUFFIX)
            try:
                os.replace(path, rejected)
                _warn(f"rank {self.rank}: {path} ignored: {problem} (moved to {rejected.name})")
            except OSError:
                self._warn_once(f"trigger:{problem}", f"{path} ignored: {problem}")
            return None
        try:
            path.unlink()
        except OSError:
            pass
        return n, requested

    def _look_for_plan(self) -> None:
        if self._board is None:
            return
        plan = self._board.read(self._seq + 1)
        if plan is None:
            return
        self._seq = plan.seq
        if self.step_num <= plan.first - 1:
            self._plan, self._window_at = plan, plan.first - 1
        else:
            self._warn_once(f"late:{plan.seq}", f"learned of window-{plan.first} at step {self.step_num}, "
                                                 "too late to profile it; it holds no trace of this rank")

    def _open_window(self) -> None:
        plan, self._window_at = self._plan, -1
        if plan is None or (self.ranks is not None and self.rank not in self.ranks):
            return
        if self._prof is not None:
            self._warn_once(f"busy:{plan.seq}", f"window-{plan.first} skipped: the fixed schedule's profiler runs")
            return
        try:
            from torch.profiler import ProfilerAction

            first, last = plan.first, plan.last

            def window_schedule(k: int):
                if k == first - 1:
                    return ProfilerAction.WARMUP
                if first <= k < last:
                    return ProfilerAction.RECORD
                return ProfilerAction.RECORD_AND_SAVE if k == last else ProfilerAction.NONE

            prof = self._new_profiler(window_schedule, self._on_window_ready)
            # number the profiler's steps as the run's, so ProfilerStep#N is the run's step N
            prof.step_num = first - 1
            prof.current_action = window_schedule(first - 1)
            if hasattr(prof, "_prev_schedule_action"):
                prof._prev_schedule_action = prof.current_action
            self._wexported = False
            prof.start()
            self._wprof = prof
            self.profiling = True
        except Exception as exc:
            self._warn_once(f"open:{plan.seq}", f"cannot profile window-{plan.first} ({exc}); training continues")
            self._wprof = None
            self._unsilence()

    def _on_window_ready(self, prof) -> None:
        plan = self._plan
        if plan is not None and self._export(prof, _win.window_dir(self.out_dir, plan.first) / f"rank{self.rank}.json.gz"):
            self._wexported = True

    def _window_step(self) -> None:
        try:
            self._wprof.step()
        except Exception as exc:
            self._warn_once("wstep", f"profiler step failed in a window ({exc}); window stopped")
            self._end_window(cut=True)
            return
        if self._plan is not None and self.step_num > self._plan.last:
            self._end_window()
        self._raise_held_interrupt()

    def _end_window(self, cut: bool = False) -> None:
        prof, self._wprof = self._wprof, None
        plan = self._plan
        partial = None
        if prof is not None:
            if cut and plan is not None and plan.first <= self.step_num <= plan.last:
                partial = self.step_num
            try:
                with _sigint_held() as held:
                    prof.stop()
                self._interrupt_held |= bool(held)
            except Exception as exc:
                self._warn_once("wstop", f"stopping the window's profiler failed ({exc})")
            finally:
                self._unsilence()
        if plan is None:
            return
        done = list(range(plan.first, min(plan.last, self.step_num - 1) + 1))
        if self._wexported and self.rank == self.manifest_rank:
            try:
                self._write_json(_win.window_dir(self.out_dir, plan.first) / "manifest.json",
                                 self._window_manifest(plan, done, partial))
            except Exception as exc:
                _warn(f"rank {self.rank}: cannot write the manifest of window-{plan.first} ({exc})")
        self._plan_done(plan)

    def _plan_done(self, plan: _win.Plan) -> None:
        self._plan, self._window_at = None, -1
        self._windows.append({"first": plan.first, "last": plan.last, "why": plan.why, "reason": plan.reason})
        # the window's steps and the one after it are slower by design: the rule starts afresh after them
        self._feed_from = plan.last + 2
        self._quiet_until = plan.last + 1 + self.cooldown_steps
        if self._rule is not None:
            self._rule.reset()

    def _window_manifest(self, plan: _win.Plan, done: list[int], partial: int | None) -> dict:
        m = self.manifest()
        pr = self.profiled_ranks
        m.update({
            "files": {str(r): f"rank{r}.json.gz" for r in pr},
            "cycle_files": {str(r): [f"rank{r}.json.gz"] for r in pr},
            "schedule": {"skip_first": plan.first - 1, "wait": 0, "warmup": 1, "active": plan.steps, "repeat": 1},
            "profiled_steps": done,
            "partial_steps": [partial] if partial is not None else [],
            "window": {"first_step": plan.first, "last_step": plan.last, "steps": plan.steps,
                       "trigger": plan.why, "reason": plan.reason, "requested": plan.requested},
        })
        return m

    def _write_json(self, path: Path, data: dict) -> None:
        """Atomically, through a temp name of this writer; no temp file is left behind on failure."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial.json")
        try:
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _store_key(self, rank: int) -> str:
        return f"fsdpdoctor.capture/{self._key_dir}/host/{rank}"

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
        from fsdpdoctor.version import __version__

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
            # the step the profiler was stopped in (close() inside the window): in the trace, but cut short
            "partial_steps": [self._partial_step] if self._partial_step is not None else [],
            "samples_per_step": self.samples_per_step,
            "tokens_per_step": self.tokens_per_step,
            "options": {"record_shapes": self.record_shapes, "with_stack": self.with_stack,
                        "profile_memory": self.profile_memory},
            "model": model,
            "wrapping": wrapping,
            "grad_presence": self._grads.describe(self.rank) if self._grads is not None else None,
            "scenario": self.scenario,
        }

    def _write_manifest_if_mine(self) -> None:
        if self.manifest_written or self.rank != self.manifest_rank or not self.fixed_window:
            return
        self.manifest_written = True
        self._learn_folder(wait=True)
        path = self.out_dir / "manifest.json"
        try:
            self._write_json(path, self.manifest())
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot write {path} ({exc}); training continues")


def capture(out_dir, *, model=None, optimizer=None, wait: int = 1, warmup: int = 1, active: int = 3,
            repeat: int = 1, skip_first: int = 0, ranks: Iterable[int] | None = None,
            with_stack: bool = True, record_shapes: bool = True, profile_memory: bool = False,
            samples_per_step: int | None = None, tokens_per_step: int | None = None,
            scenario: dict | None = None, hang_timeout_s: float | None = None,
            fixed_window: bool = True, auto: bool = False, window_steps: int = 3, max_windows: int = 5,
            max_window_bytes: int = MAX_WINDOW_BYTES, cooldown_steps: int | None = None,
            min_rise: float = _win.MIN_RISE) -> Capture:
    """Profile a training loop into ``out_dir`` (one ``rank<N>.json.gz`` per profiled rank
    plus ``manifest.json``), and keep every rank's step series for the whole run.

    Use as a context manager (call ``.step()`` once per training step) or as a
    decorator on the step function. ``ranks=None`` profiles all ranks. The
    schedule is torch.profiler's: ``skip_first`` steps, then ``repeat`` cycles of
    ``wait`` + ``warmup`` + ``active`` steps (``fixed_window=False``: none). ``samples_per_step`` and
    ``tokens_per_step`` are global (summed over ranks) per optimizer step.
    ``hang_timeout_s=N`` also starts the hang watchdog (``fsdpdoctor.capture.watch``): with no
    ``step()`` for N seconds every rank writes ``hang/rank<N>.json`` (docs/hang.md).

    Armed for the whole run (docs/capture.md): every rank writes ``steps/rank<N>.steps``;
    ``fsdpdoctor trigger OUT_DIR --steps N`` profiles the same N steps on every rank into
    ``OUT_DIR/window-<first step>/``; with ``auto=True`` a window of ``window_steps`` steps opens by itself
    when steps get slower than the run's recent behaviour (at most ``max_windows`` windows and
    ``max_window_bytes`` on disk, none within ``cooldown_steps`` steps after a window); ``min_rise`` is
    the least slowdown worth a window (0.1: steps 10 % slower than the recent median).
    """
    return Capture(out_dir, model=model, optimizer=optimizer, wait=wait, warmup=warmup,
                   active=active, repeat=repeat, skip_first=skip_first, ranks=ranks,
                   with_stack=with_stack, record_shapes=record_shapes,
                   profile_memory=profile_memory, samples_per_step=samples_per_step,
                   tokens_per_step=tokens_per_step, scenario=scenario, hang_timeout_s=hang_timeout_s,
                   fixed_window=fixed_window, auto=auto, window_steps=window_steps, max_windows=max_windows,
                   max_window_bytes=max_window_bytes, cooldown_steps=cooldown_steps, min_rise=min_rise)
