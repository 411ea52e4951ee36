"""The profiling schedule: torch.profiler on the fixed wait/warmup/active schedule, one gzipped
chrome trace per profiled rank and cycle, each written through a temp name and summarised in the
background (a mixin of :class:`fsdpdoctor.capture.core.Capture`, whose state it shares)."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from fsdpdoctor.capture.background_summary import start_summary
from fsdpdoctor.capture.safety import _restore_warning_filter, _sigint_held, _silence_tracer_grad_warning, _warn


class ProfilingSchedule:
    """Which ranks and steps the fixed schedule profiles, and the profiler that does it."""

    # Each exported trace gets its rank<N>.summary.msgpack from a separate, niced process, so that
    # `fsdpdoctor analyze` on the folder reads summaries, not traces. Never on the training thread,
    # never an error in the job. Set to False (or FSDPDOCTOR_NO_SUMMARY=1) to skip.
    write_summaries = True

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

    def _start_fixed_profiler(self) -> None:
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
        ended = self.step_num - 1   # step() counted the step that just ended
        if self._in_fixed_window(ended) and not self._in_fixed_window(ended + 1):
            self._note_cpu_share()  # the window's last step: before prof.step() exports it
        try:
            self._prof.step()
        except Exception as exc:
            _warn(f"rank {self.rank}: profiler step failed ({exc}); profiling stopped")
            self._stop_profiler()
            return
        if self._in_fixed_window(self.step_num) and not self._in_fixed_window(ended):
            self._cpu_at_start = _cpu_reading()   # the window's first step begins now
        if self._total_steps is not None and self.step_num >= self._total_steps:
            self._finished = True
            self._stop_profiler()
            self._write_manifest_if_mine()
        self._raise_held_interrupt()

    _cpu_at_start: dict | None = None
    _host_load: list | None = None   # the manifest rank's own reading per window (manifest "host_load")

    def _note_cpu_share(self) -> None:
        """Into the trace (``fsdpdoctor_cpu``): how long this rank's training thread was on a CPU and how long
        runnable but waiting for one over the recorded steps (Linux schedstat), the same summed over every
        thread of the process (loader, gloo, pin-memory threads), the host's load average at the window's
        start and end and the cores this process may run on. Where ranks share a host's cores with other work,
        that says how fast a rank computes beside the others and alone, which the straggler's saving rests on
        (analysis/stragglers.py), and how starved the window was, which every prediction's interval rests on
        (analysis/contention.py); nothing is written where the kernel does not say, and nothing here raises."""
        start, self._cpu_at_start = self._cpu_at_start, None
        end = _cpu_reading()
        if start is None or end is None or self._prof is None:
            return
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count()
        doc = {"wall_us": (end["wall"] - start["wall"]) / 1e3, "on_cpu_us": (end["on_cpu"] - start["on_cpu"]) / 1e3,
               "runqueue_us": (end["queued"] - start["queued"]) / 1e3, "cpus": cpus}
        if start.get("load") is not None and end.get("load") is not None:
            doc["loadavg"] = [start["load"], end["load"]]
        if start.get("threads") and end.get("threads"):
            # threads alive at both ends (one that started or ended inside the window is left out)
            both = start["threads"].keys() & end["threads"].keys()
            doc["threads"] = len(both)
            doc["threads_on_cpu_us"] = sum(end["threads"][t][0] - start["threads"][t][0] for t in both) / 1e3
            doc["threads_runqueue_us"] = sum(end["threads"][t][1] - start["threads"][t][1] for t in both) / 1e3
        try:
            self._prof.add_metadata_json("fsdpdoctor_cpu", json.dumps(doc))
        except Exception:
            pass  # a profiler without metadata: the analysis goes without it
        if self.rank == self.manifest_rank:
            self._host_load = (self._host_load or []) + [{k: doc[k] for k in ("cpus", "loadavg") if k in doc} | {
                "wait_share": round(doc["runqueue_us"] / doc["wall_us"], 4) if doc["wall_us"] > 0 else None}]

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

    def _summarize_in_background(self, path: Path) -> None:
        if not self.write_summaries or os.environ.get("FSDPDOCTOR_NO_SUMMARY"):
            return
        try:
            if not hasattr(self, "_param_dtype"):
                self._param_dtype = self._model_param_dtype()
            start_summary(path, self._param_dtype)
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot start the trace summary ({exc}); `fsdpdoctor summarize` builds it later")


def _cpu_reading() -> dict | None:
    """The calling thread's wall, on-CPU and run-queue ns, every thread's (on-CPU, run-queue) ns by thread id and
    the 1-minute load average; None where /proc does not say. A few dozen small reads: once at each end of a
    window."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            on_cpu, queued = f.read().split()[:2]
        out = {"wall": time.monotonic_ns(), "on_cpu": int(on_cpu), "queued": int(queued)}
    except (OSError, ValueError):
        return None
    try:
        out["load"] = round(os.getloadavg()[0], 2)
    except OSError:
        out["load"] = None
    threads = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                    a, b = f.read().split()[:2]
                threads[tid] = (int(a), int(b))
            except (OSError, ValueError):
                continue  # a thread that ended meanwhile
    except OSError:
        pass
    out["threads"] = threads
    return out
