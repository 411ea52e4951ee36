"""Hang watchdog: when training makes no progress for ``timeout_s`` seconds, every rank writes
``<out_dir>/hang/rank<N>.json`` (its flight-recorder entries, the Python stacks of all its
threads, the last completed step) for ``fsdpdoctor hang``.

Usage (jobs that do not profile; ``capture(..., hang_timeout_s=N)`` does the same)::

    from fsdpdoctor.capture import watch

    with watch("runs/r1", timeout_s=300) as w:
        for batch in loader:
            train_step(batch)
            w.step()

Guarantees and costs:

* Off by default; never kills, signals or slows the job. ``step()`` stores a counter and a clock
  reading. A daemon thread wakes every ``timeout_s / 4`` (so a dump comes at most a quarter of
  the timeout late) and does nothing else until it fires. A failure to write is one
  ``RuntimeWarning``, never an exception in the job.
* Flight recorder: torch records each rank's collectives (process group, sequence number, op,
  sizes, the Python frames that issued it) when ``TORCH_FR_BUFFER_SIZE`` is non-zero *at the time
  the process group is created* (torch 2.13 records 2000 entries by default; older releases
  record nothing unless it is set). ``watch`` sets ``TORCH_FR_BUFFER_SIZE=2000`` when it is unset,
  which only helps when the watch starts before ``init_process_group``; call
  :func:`enable_flight_recorder` first thing in the job to be sure. When the dump holds no
  entries the reason is written in it (``flight_recorder.note``).
* Two ways to get the stacks, because a Python thread cannot run while another thread holds the
  GIL (a C extension looping without releasing it): the watchdog thread takes
  ``sys._current_frames()`` (all threads, with source lines) when it can run; and CPython's
  ``faulthandler`` C-level timer, re-armed by the watchdog while steps progress, writes every
  thread's traceback to ``hang/rank<N>.faulthandler.txt`` without the GIL when the watchdog
  itself is stuck. The same file gets every thread's traceback when the rank dies of a fatal
  signal (gloo's size-mismatch check calls ``abort()``) or is sent SIGTERM (torchrun ends the
  other ranks when one fails); faulthandler then chains to the previous handler, so the rank
  still dies as it would have. The file holds only a header line while nothing happened and is
  removed by ``close()``. ``faulthandler`` is process-wide: with ``gil_fallback=False`` the watch
  leaves it alone (for jobs that use it themselves). A rank stopped by the kernel (SIGKILL, out of
  memory, frozen) writes nothing: ``fsdpdoctor hang`` names it.
* On an exception leaving the ``with`` block (gloo's "connection closed" or size-mismatch
  errors, a crash in one rank) the rank writes the same dump with ``trigger: "exception"`` and the
  exception's traceback, so a job that aborts also leaves forensics.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

from fsdpdoctor.hang_format import (DUMP_VERSION, FOLDER, DumpDoc, FaultHeader, FrameDoc, GroupDoc, JsonTrigger,
                                    SampleDoc, ThreadDoc, dump_name, faulthandler_name, recovered_name)

FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_ENV_OLD = "TORCH_NCCL_TRACE_BUFFER_SIZE"   # the name before torch 2.6
FR_DEFAULT_ENTRIES = 2000                       # torch's own default buffer size
STACK_SAMPLES = 5                               # main-thread samples: moving lines = a busy loop
STACK_SAMPLE_GAP_S = 0.05                       # a 0.2 s window


def _warn(msg: str) -> None:
    warnings.warn(f"fsdpdoctor.capture.watch: {msg}", RuntimeWarning, stacklevel=3)


def enable_flight_recorder(entries: int = FR_DEFAULT_ENTRIES) -> bool:
    """Turn torch's flight recorder on for process groups created from now on (call before
    ``init_process_group``). Keeps a value the user set. Returns True when the recorder will be
    on for groups created now."""
    if FR_ENV not in os.environ and FR_ENV_OLD not in os.environ:
        os.environ[FR_ENV] = str(int(entries))
    value = os.environ.get(FR_ENV, os.environ.get(FR_ENV_OLD, "0"))
    return value.strip() not in ("", "0")


def _pg_exists() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()
    except Exception:
        return False


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1


def _json_safe(obj):
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def flight_recorder_dump() -> dict:
    """This process's flight-recorder buffer, JSON-safe. The pickle variant carries the Python
    frames that issued each collective; the JSON variant is the fallback."""
    out: dict = {"format": None, "entries": [], "pg_status": {}, "version": None, "error": None}
    try:
        import pickle

        from torch._C._distributed_c10d import _dump_fr_trace

        raw = pickle.loads(_dump_fr_trace())
        out["format"] = "pickle"
    except Exception as exc:  # noqa: BLE001 - any failure falls back to the JSON variant
        try:
            from torch._C._distributed_c10d import _dump_fr_trace_json

            raw = json.loads(_dump_fr_trace_json())
            out["format"] = "json"
        except Exception as exc2:  # noqa: BLE001
            out["error"] = f"{type(exc).__name__}: {exc}; {type(exc2).__name__}: {exc2}"
            return out
    raw = _json_safe(raw)
    out["version"] = raw.get("version")
    out["pg_status"] = raw.get("pg_status") or {}
    out["entries"] = raw.get("entries") or []
    return out


def process_groups() -> dict[str, GroupDoc]:
    """{pg name: {desc, backend, ranks (global)}} of every live process group."""
    groups: dict = {}
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _world

        for pg, name in list(_world.pg_names.items()):
            ranks = sorted(int(r) for r in (_world.pg_group_ranks.get(pg) or {}))
            try:
                backend = str(dist.get_backend(pg))
            except Exception:
                backend = None
            groups[str(name)] = {"desc": getattr(pg, "group_desc", None), "backend": backend, "ranks": ranks}
    except Exception:
        pass
    return groups


def _frames(stack: traceback.StackSummary) -> list[FrameDoc]:
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
            for f in stack]


def thread_stacks(skip_ident: int | None = None) -> list[ThreadDoc]:
    """Every Python thread's stack, outermost frame first (innermost last)."""
    meta = {t.ident: t for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == skip_ident:
            continue
        t = meta.get(ident)
        out.append({"id": ident, "name": t.name if t else f"thread-{ident}", "main": ident == main,
                    "daemon": bool(t.daemon) if t else None,
                    "frames": _frames(traceback.extract_stack(frame))})
    out.sort(key=lambda s: (not s["main"], s["name"]))
    return out


def _main_runnable_s() -> float | None:
    """Seconds the main thread has been runnable so far: on a CPU plus waiting in the run queue
    (/proc schedstat, Linux). A spinning thread is runnable all the time however loaded the machine
    is; a waiting one (lock, sleep, socket) almost never. Falls back to CPU time; None off Linux."""
    try:
        task = Path(f"/proc/self/task/{threading.main_thread().native_id}")
        try:
            on_cpu_ns, queued_ns = (task / "schedstat").read_text().split()[:2]
            return (int(on_cpu_ns) + int(queued_ns)) / 1e9
        except (OSError, ValueError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


def _main_sample() -> SampleDoc | None:
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return None
    return {"file": frame.f_code.co_filename, "line": frame.f_lineno, "function": frame.f_code.co_name}


class Watch:
    """See the module docstring and :func:`watch`."""

    def __init__(self, out_dir, timeout_s: float, *, gil_fallback: bool = True, flight_recorder: bool = True):
        if not timeout_s or timeout_s <= 0:
            raise ValueError("watch: timeout_s must be > 0")
        self.out_dir = Path(out_dir)
        self.timeout_s = float(timeout_s)
        self.poll_s = self.timeout_s / 4.0
        self.gil_fallback = gil_fallback
        self.flight_recorder = flight_recorder
        self.steps = 0                     # completed steps (step() calls)
        self.dumps = 0                     # dumps written by this rank
        self.rank, self.world_size = 0, 1
        self._last = time.monotonic()
        self._fired_at_step: int | None = None
        self._armed_at_step: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fh_file = None
        self._fh_was_enabled = False
        self._fh_sigterm = False
        self._fh_path = Path()
        self._fr_enabled_at_start: bool | None = None
        self._fr_set_late = False          # the watch set TORCH_FR_BUFFER_SIZE after the group existed
        self._pg_existed_at_start = False
        self._started = False

    @property
    def dump_path(self) -> Path:
        return self.out_dir / FOLDER / dump_name(self.rank)

    @property
    def faulthandler_path(self) -> Path:
        return self.out_dir / FOLDER / faulthandler_name(self.rank)

    def _name_faulthandler_file(self) -> None:
        """The rank is known now: give the file its rank name (the open descriptor stays valid)."""
        self.rank, self.world_size = _rank_world()
        try:
            os.replace(self._fh_path, self.faulthandler_path)
            self._fh_path = self.faulthandler_path
        except OSError:
            pass

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Watch:
        if self._started:
            return self
        self._started = True
        self._pg_existed_at_start = _pg_exists()
        if self.flight_recorder:
            unset = FR_ENV not in os.environ and FR_ENV_OLD not in os.environ
            self._fr_enabled_at_start = enable_flight_recorder()
            self._fr_set_late = unset and self._pg_existed_at_start
        self.rank, self.world_size = _rank_world()
        self._last = time.monotonic()
        if self.gil_fallback:
            self._install_faulthandler()
        self._thread = threading.Thread(target=self._run, name="fsdpdoctor-hang-watchdog", daemon=True)
        self._thread.start()
        return self

    def step(self) -> None:
        """Mark one completed training step (progress)."""
        self.steps += 1
        self._last = time.monotonic()

    def close(self) -> None:
        """Stop the watchdog; a faulthandler file that stayed empty is removed. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self._disarm_faulthandler()

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        stalled = self._fired_at_step is not None and self._fired_at_step == self.steps
        if exc is not None and not (exc_type is SystemExit and not exc.code) \
                and not (isinstance(exc, KeyboardInterrupt) and stalled):  # Ctrl-C on a hang: keep its dump
            self.dump("exception", exception=exc)
        self.close()
        return False

    # ------------------------------------------------------------------ watchdog
    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                idle = time.monotonic() - self._last
                steps = self.steps
                if idle >= self.timeout_s:
                    if self._fired_at_step != steps:
                        self._fired_at_step = steps
                        self._disarm_faulthandler(keep_file=True)
                        self.dump("timeout", idle_s=idle)
                else:
                    if self._fired_at_step is not None and steps != self._fired_at_step:
                        self._set_aside_recovered()
                    if self._fh_file is not None and self._fh_path.name.startswith(".pid") and self._rank_known():
                        self._name_faulthandler_file()
                    if self.gil_fallback and self._armed_at_step != steps:
                        self._arm_faulthandler()
                        self._armed_at_step = steps
            except Exception as exc:  # noqa: BLE001 - the watchdog must never die noisily twice
                _warn(f"rank {self.rank}: watchdog error ({exc}); hang dumps disabled")
                return

    def _set_aside_recovered(self) -> None:
        """Steps resumed after a dump (a slow checkpoint, not a hang): keep the dump as
        ``rank<N>.recovered.json`` so ``fsdpdoctor hang`` reads only a stall still in progress."""
        self._fired_at_step = None
        try:
            if self.dump_path.exists():
                os.replace(self.dump_path, self.dump_path.with_name(recovered_name(self.rank)))
        except OSError:
            pass

    @staticmethod
    def _rank_known() -> bool:
        """A process group exists or the launcher set RANK: the file name will not collide
        (mp.spawn jobs have no RANK until init_process_group)."""
        return _pg_exists() or "RANK" in os.environ

    def _install_faulthandler(self) -> None:
        """Fatal signals and SIGTERM write every thread's traceback to the faulthandler file."""
        import faulthandler
        import signal

        # before the process group exists a process started without RANK (mp.spawn) does not know
        # its rank yet: a per-process name, renamed by the watchdog once the rank is known
        self._fh_path = self.faulthandler_path if self._rank_known() else \
            self.out_dir / FOLDER / f".pid{os.getpid()}.faulthandler.txt"
        try:
            self._fh_path.parent.mkdir(parents=True, exist_ok=True)
            self._fh_file = open(self._fh_path, "w")
            self._fh_was_enabled = faulthandler.is_enabled()
            self._write_fh_header()
            faulthandler.enable(file=self._fh_file, all_threads=True)
            if hasattr(faulthandler, "register") and hasattr(signal, "SIGTERM"):
                faulthandler.register(signal.SIGTERM, file=self._fh_file, all_threads=True, chain=True)
                self._fh_sigterm = True
        except Exception as exc:  # noqa: BLE001
            _warn(f"rank {self.rank}: no faulthandler fallback ({exc})")
            self._fh_file = None

    def _write_fh_header(self) -> None:
        self._fh_file.seek(0)
        self._fh_file.truncate()
        # the world size too: a reader that finds only this header still knows how many ranks to expect
        self._fh_file.write(FaultHeader(self.rank, self.steps, self.timeout_s, time.time(),
                                            self.world_size if self._rank_known() else None).line())
        self._fh_file.flush()

    def _arm_faulthandler(self) -> None:
        import faulthandler

        if self._fh_file is None:
            return
        self._write_fh_header()
        # the C timer needs no GIL: it answers when this thread cannot run
        faulthandler.dump_traceback_later(self.timeout_s + self.poll_s, repeat=False, file=self._fh_file)

    def _disarm_faulthandler(self, keep_file: bool = False) -> None:
        if self._fh_file is None:
            return
        import faulthandler
        import signal

        try:
            faulthandler.cancel_dump_traceback_later()
        except Exception:
            pass
        if keep_file:
            return
        try:
            if self._fh_sigterm:
                faulthandler.unregister(signal.SIGTERM)
            if self._fh_was_enabled:
                faulthandler.enable(file=sys.stderr, all_threads=True)
            else:
                faulthandler.disable()
        except Exception:
            pass
        f, self._fh_file = self._fh_file, None
        try:
            f.close()
            text = self._fh_path.read_text()
            if not any(line.strip() and not line.startswith("#") for line in text.splitlines()):
                self._fh_path.unlink()
                try:
                    self._fh_path.parent.rmdir()  # only when empty
                except OSError:
                    pass
        except Exception:
            pass

    # ------------------------------------------------------------------ the dump
    def snapshot(self, trigger: JsonTrigger, *, idle_s: float | None = None,
                 exception: BaseException | None = None) -> DumpDoc:
        me = threading.current_thread().ident if threading.current_thread() is self._thread else None
        # the flight recorder and the stacks first: an aborting job may be killed any moment now
        fr = flight_recorder_dump() if self.flight_recorder else {"format": None, "entries": [], "pg_status": {},
                                                                   "version": None, "error": None}
        threads = thread_stacks(skip_ident=me)
        samples = []
        runnable = None
        if trigger == "timeout":  # the main thread is elsewhere: is it moving or spinning (a busy loop)?
            run0, t0 = _main_runnable_s(), time.monotonic()
            for i in range(STACK_SAMPLES):
                if i:
                    time.sleep(STACK_SAMPLE_GAP_S)
                s = _main_sample()
                if s:
                    samples.append(s)
            run1, t1 = _main_runnable_s(), time.monotonic()
            if run0 is not None and run1 is not None and t1 > t0:
                runnable = round((run1 - run0) / (t1 - t0), 3)
        env = os.environ.get(FR_ENV, os.environ.get(FR_ENV_OLD))
        note = None
        if not fr["entries"] and not fr["error"]:
            if env is not None and env.strip() in ("", "0"):
                note = f"{FR_ENV}={env}: the flight recorder is off; set {FR_ENV}={FR_DEFAULT_ENTRIES} before init_process_group"
            elif self._fr_set_late:
                note = (f"{FR_ENV} was unset when the process group was created (the watch set it too late) and "
                        "this torch records nothing by default: set it before init_process_group, or call "
                        "fsdpdoctor.capture.enable_flight_recorder() first")
            else:
                note = "no collective recorded (none issued yet, or the flight recorder is off in this torch)"
        elif self._fr_set_late:
            note = (f"{FR_ENV} was unset when the process group was created: these entries come from torch's default "
                    "buffer; set it before init_process_group to be sure of them on other torch versions")
        exc_doc = None
        if exception is not None:
            exc_doc = {"type": type(exception).__name__, "message": str(exception).strip()[:2000],
                       "frames": _frames(traceback.extract_tb(exception.__traceback__))}
        return {
            "fsdpdoctor_hang": DUMP_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "trigger": trigger,
            "time_unix": time.time(),
            "timeout_s": self.timeout_s,
            "last_step": self.steps,
            "seconds_since_step": round(idle_s if idle_s is not None else time.monotonic() - self._last, 3),
            "exception": exc_doc,
            "flight_recorder": {"buffer_size_env": env, "set_before_process_group": not self._pg_existed_at_start,
                                "note": note, **fr},
            "groups": process_groups(),
            "threads": threads,
            "main_samples": samples,
            "main_runnable_share": runnable,  # share of the sampling window the main thread was runnable
        }

    def dump(self, trigger: str, *, idle_s: float | None = None, exception: BaseException | None = None) -> Path | None:
        """Write ``hang/rank<N>.json`` now (atomically). Returns the path, or None after a warning."""
        try:
            self.rank, self.world_size = _rank_world()
            doc = self.snapshot(trigger, idle_s=idle_s, exception=exception)
            path = self.dump_path
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{threading.get_ident()}.partial")
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
            os.replace(tmp, path)
            self.dumps += 1
            print(f"fsdpdoctor: rank {self.rank}: no step for {doc['seconds_since_step']:.1f} s, wrote {path}"
                  if trigger == "timeout" else f"fsdpdoctor: rank {self.rank}: {trigger}, wrote {path}",
                  file=sys.stderr, flush=True)
            return path
        except Exception as exc:  # noqa: BLE001
            _warn(f"rank {self.rank}: cannot write the hang dump ({exc}); training continues")
            return None


def watch(out_dir, timeout_s: float, *, gil_fallback: bool = True, flight_recorder: bool = True) -> Watch:
    """A hang watchdog for ``out_dir`` (see the module docstring): use as a context manager and
    call ``.step()`` once per training step."""
    return Watch(out_dir, timeout_s, gil_fallback=gil_fallback, flight_recorder=flight_recorder)
