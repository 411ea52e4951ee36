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
import functools
import os
import uuid
from pathlib import Path
from collections.abc import Callable, Iterable

from fsdpdoctor.capture import series as _series
from fsdpdoctor.capture import slowdown as _slow
from fsdpdoctor.capture import claim as _claim
from fsdpdoctor.capture import windows as _win
from fsdpdoctor.capture.grads import GradPresence
from fsdpdoctor.capture.coordinator import FOLDER_WAIT_S, MAX_WINDOW_BYTES, WindowCoordinator, _now_ns
from fsdpdoctor.capture.manifest import track_fsdp2_prefetch_calls
from fsdpdoctor.capture.manifest_writer import HOST_WAIT_S, ManifestWriter, _rank_world
from fsdpdoctor.capture.profiling import ProfilingSchedule
from fsdpdoctor.capture.safety import _drop_own_frames, _sigint_held, _warn
from fsdpdoctor.capture.watch import Watch as _Watch

__all__ = ["Capture", "capture", "track_fsdp2_prefetch_calls", "HOST_WAIT_S", "FOLDER_WAIT_S", "MAX_WINDOW_BYTES"]


class Capture(ProfilingSchedule, WindowCoordinator, ManifestWriter):
    """See :func:`capture`."""

    def __init__(self, out_dir, *, model=None, optimizer=None, wait: int = 1, warmup: int = 1,
                 active: int = 3, repeat: int = 1, skip_first: int = 0,
                 ranks: Iterable[int] | None = None, with_stack: bool = True,
                 record_shapes: bool = True, profile_memory: bool = False,
                 samples_per_step: int | None = None, tokens_per_step: int | None = None,
                 scenario: dict | None = None, hang_timeout_s: float | None = None,
                 fixed_window: bool = True, auto: bool = False, window_steps: int = 3,
                 max_windows: int = 5, max_window_bytes: int = MAX_WINDOW_BYTES,
                 cooldown_steps: int | None = None, min_rise: float = _slow.MIN_RISE):
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
        self.cooldown_steps = int(cooldown_steps) if cooldown_steps is not None else 2 * _slow.REFERENCE_STEPS
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
        self.framework: dict | None = None   # the framework callbacks record theirs (capture/host.py)
        self.warnings: list[str] = []        # what the manifest must say the capture could not do
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
        self._rule = _slow.SlowdownRule(float(min_rise)) if self.auto else None
        self._peer_waits: dict[int, tuple[int, int, float]] = {}   # coordinator: CPU wait last read per peer rank
        # per step on the coordinator: slow steps (above the rule's limit) since the last poll, and how many
        # of them make the rule decide: then the poll comes at once, not up to POLL_S later
        self._hot, self._hot_need, self._hot_limit_ns = 0, 1 << 30, 1 << 62
        self._last_end_ns = 0
        self._seq = 0                # plans seen
        self._plan: _win.Plan | None = None
        self._window_at = -1         # step_num at which the planned window's warm-up step begins
        self._wprof = None
        self._wexported = False
        self._windows: list[dict] = []   # windows this rank took part in
        self._quiet_until = 0        # no automatic window before this step (cool-down)
        self._warned: set[str] = set()
        self._requests_seen: set[str] = set()    # trigger requests honoured (or refused) once, by key
        self._requests_kept: list[str] = []      # ... of which the job could not remove the file
        self._windows_planned: list[_win.Plan] = []   # the coordinator's plans (caps on windows and disk)
        self._pending_manifests: list = []   # windows whose manifest waits for the other ranks' reports
        self._feed_from = 0          # first step the anomaly rule may judge
        self._origin_unix_ns = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Capture:
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
        self._start_fixed_profiler()
        return self

    def _in_fixed_window(self, step: int) -> bool:
        """Whether ``step`` is an active step of the fixed schedule."""
        cycle = self.wait + self.warmup + self.active
        k = step - self.skip_first
        return (self.fixed_window and k >= 0 and k % cycle >= self.wait + self.warmup
                and (self.repeat == 0 or k // cycle < self.repeat))

    def step(self) -> None:
        """Mark the end of one training step."""
        now = _now_ns()
        self._ends.append(now)
        if now - self._last_end_ns > self._hot_limit_ns:
            self._hot += 1
            if self._hot >= self._hot_need:
                self._next_poll = now
        self._last_end_ns = now
        if self._grads is not None:
            self._grads.end_step(self._in_fixed_window(self.step_num))
        self.step_num += 1
        if self._watch is not None:
            self._watch.step()
        if self._prof is not None:
            self._fixed_step()
        if self._wprof is not None:
            self._window_step()
        if now >= self._next_poll or self.step_num == self._window_at:
            # file work and window starts hold a Ctrl-C: it is raised once the step's bookkeeping is whole
            with _sigint_held() as held:
                if now >= self._next_poll:
                    self._poll(now)
                if self.step_num == self._window_at:
                    self._open_window()
            self._interrupt_held |= bool(held)
            self._raise_held_interrupt()

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
            if self._pending_manifests:
                with _sigint_held() as held:   # torchrun's second Ctrl-C waits for the manifest
                    self._write_ready_manifests(wait_s=HOST_WAIT_S)
                self._interrupt_held |= bool(held)
            self._next_poll = 1 << 62
            self._flush()
        except Exception as exc:
            _warn(f"rank {self.rank}: closing the capture failed ({exc})")
        finally:
            if self._series is not None:
                self._series.close()
            if self.rank == 0:
                _claim.release_claim(self.out_dir, self._job)
                _win.forget_taken(self.out_dir)
                if self._board is not None:
                    self._board.clear(self._seq, range(self.world_size))
            if self._watch is not None:
                self._watch.close()
        self._raise_held_interrupt()

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        # an exception is already ending the job: a second Ctrl-C during the export is not raised again
        self._exiting = exc_type is not None
        with _sigint_held() as held:   # torchrun's second Ctrl-C waits for the last files
            if self._watch is not None:
                self._watch.__exit__(exc_type, exc, tb)  # an aborting job dumps too
            self.close()
        self._interrupt_held |= bool(held)
        if isinstance(exc, KeyboardInterrupt):
            _drop_own_frames(tb)
        self._raise_held_interrupt()
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



def capture(out_dir, *, model=None, optimizer=None, wait: int = 1, warmup: int = 1, active: int = 3,
            repeat: int = 1, skip_first: int = 0, ranks: Iterable[int] | None = None,
            with_stack: bool = True, record_shapes: bool = True, profile_memory: bool = False,
            samples_per_step: int | None = None, tokens_per_step: int | None = None,
            scenario: dict | None = None, hang_timeout_s: float | None = None,
            fixed_window: bool = True, auto: bool = False, window_steps: int = 3, max_windows: int = 5,
            max_window_bytes: int = MAX_WINDOW_BYTES, cooldown_steps: int | None = None,
            min_rise: float = _slow.MIN_RISE) -> Capture:
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
