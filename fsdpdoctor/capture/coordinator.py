"""The window coordinator: the step series written at every poll, and the windows the ranks agree
on (rank 0 reads trigger requests and judges its step times; every other rank reads its plans),
profiled on exactly the planned steps (docs/capture.md). A mixin of
:class:`fsdpdoctor.capture.core.Capture`, whose state it shares; the rules live in ``windows.py``."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from fsdpdoctor.capture import series as _series
from fsdpdoctor.capture import slowdown as _slow
from fsdpdoctor.capture import claim as _claim
from fsdpdoctor.capture import windows as _win
from fsdpdoctor.capture.manifest_writer import HOST_WAIT_S
from fsdpdoctor.capture.safety import _sigint_held, _warn

_now_ns = time.perf_counter_ns
_POLL_NS = int(_win.POLL_S * 1e9)
# Above this, an automatic window is not opened: window folders of this run already hold this much.
MAX_WINDOW_BYTES = 2 << 30
# A rank other than the coordinator buffers its step series until it knows the job's folder, at most this long.
FOLDER_WAIT_S = 10.0
# Ranks on the coordinator's host whose CPU wait it reads (torchrun numbers a host's ranks 0..LOCAL_WORLD_SIZE-1
# on the first host): a load spike there hits them together; more would only add store traffic per poll.
MAX_LOAD_PEERS = 8
# Polls (of POLL_S) over which the coordinator remembers how fast the steps ran (a demand window's lead).
FAST_POLLS = 20


def _folder_bytes(folders: list[Path]) -> int:
    total = 0
    for d in folders:
        try:
            with os.scandir(d) as it:
                total += sum(e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False))
        except OSError:
            pass
    return total


class WindowCoordinator:
    """The armed part of a capture: step series, trigger requests, automatic windows."""

    def _folder_key(self) -> str:
        return f"fsdpdoctor.capture/{self._key_dir}/folder"

    def _arm(self) -> None:
        """Start the step series; the coordinator (rank 0) claims the run folder (docs/capture.md)."""
        self._origin_ns = self._prev_end = self._last_end_ns = _now_ns()
        self._origin_unix_ns = time.time_ns()
        try:
            if self.rank == 0:
                folder, other = _claim.claim_folder(self.out_dir, self._job, socket.gethostname())
                if folder != self.out_dir:
                    _warn(f"{self.out_dir} is in use by another running job (host {other.host}, pid {other.pid}); "
                          f"this job writes to {folder}")
                    self.out_dir = folder
                if self._store is not None:
                    self._store.set(self._folder_key(), str(self.out_dir))
            elif self._store is not None:
                self._folder_known = False
                self._learn_folder()
            if self.rank == 0:  # requests an earlier job took but could not remove are not taken again
                self._requests_kept = sorted(_win.read_taken(self.out_dir))
                self._requests_seen.update(self._requests_kept)
            self._board = _win.Board(self.out_dir if self._store is None else Path(self._key_dir), self._store)
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot claim {self.out_dir} ({exc}); writing there")
        self._next_poll = self._origin_ns + _POLL_NS
        if self._rule is not None:
            w = _slow.cpu_wait_ns()   # never raises: None where the kernel does not say
            self._cpu_wait_prev = None if w is None else (self._origin_ns, w)

    # ------------------------------------------------------------------ CPU wait (slowdown.py: own time)
    def _load_peers(self) -> range:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return range(1, min(local, self.world_size, MAX_LOAD_PEERS))

    def _cpu_wait_key(self, rank: int) -> str:
        return f"fsdpdoctor.capture/{self._key_dir}/cpuwait/{rank}"

    def _sample_cpu_wait(self, now: int) -> None:
        """Each rank reads the time its training thread waited for a CPU since its last poll; the
        coordinator's host's other ranks publish theirs in the store, and the coordinator takes the
        largest share of the interval any of them waited (``self._wait_share``): the load of the machine
        on the job, which the slowdown rule takes out of the steps."""
        prev = self._cpu_wait_prev
        w = _slow.cpu_wait_ns()
        if prev is None or w is None:
            return
        self._cpu_wait_prev = (now, w)
        if self.rank != 0:
            if self._store is not None and self.rank in self._load_peers():
                self._store.set(self._cpu_wait_key(self.rank), f"{now} {w}")
            return
        shares = [(w - prev[1]) / (now - prev[0])] if now > prev[0] else []
        peers = list(self._load_peers()) if self._store is not None else []
        keys = [self._cpu_wait_key(r) for r in peers]
        if keys and self._store.check(keys):
            for r, raw in zip(peers, self._store.multi_get(keys)):
                t, v = map(int, raw.split())
                old = self._peer_waits.get(r)   # (time, wait, share over its last interval)
                if old is None or t > old[0]:
                    old = self._peer_waits[r] = (t, v, (v - old[1]) / (t - old[0]) if old else 0.0)
                shares.append(old[2])   # a peer that has not polled since: its last interval's share
        self._wait_share = min(max(shares, default=0.0), _slow.MAX_WAIT_SHARE)

    _fast_s: list[float] = []
    _cpu_wait_prev: tuple[int, int] | None = None
    _wait_share = 0.0
    _peer_waits: dict

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
            if self._rule is not None:
                try:
                    self._sample_cpu_wait(now)
                except Exception as exc:  # the rule then judges the steps as they are
                    self._cpu_wait_prev = None
                    self._warn_once("cpuwait", f"CPU wait not read ({type(exc).__name__}: {exc}); "
                                               "automatic windows judge whole steps")
            if self._pending_manifests:
                self._write_ready_manifests()
            if self.rank == 0:
                _claim.refresh_claim(self.out_dir)
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
        if durations:   # the fastest tenth of each poll's steps, over the last FAST_POLLS polls
            self._fast_s = (self._fast_s + [sorted(durations)[len(durations) // 10]])[-FAST_POLLS:]
        if self._plan is not None:
            return
        fixed_end = self._fixed_end()
        request = self._read_trigger()
        reason = self._judge(first, durations, fixed_end) if request is None else None
        if request is None and reason is None:
            return
        if fixed_end is None:
            self._warn_once("forever", "the fixed schedule repeats forever (repeat=0): no other window can open")
            return
        if request is None and not self._anomaly_allowed(reason):
            return
        self._plan_window(request, reason, fixed_end, durations)

    def _judge(self, first: int, durations: list[float], fixed_end: int | None) -> str | None:
        """Feed the slowdown rule the steps it may judge; arm the per-step check (Capture.step) that asks
        for a poll as soon as enough slow steps arrived for a decision."""
        rule = self._rule
        if rule is None or fixed_end is None:
            return None
        reason = None
        skip = max(0, max(fixed_end, self._feed_from) - first)
        share = self._wait_share   # slowdown.py takes it out of the steps (their own time)
        if skip < len(durations):
            reason = rule.feed(first + skip, durations[skip:], share)
        self._hot = 0
        self._hot_need = rule.more_needed()
        self._hot_limit_ns = int(rule.limit * 1e9) if rule.limit is not None else 1 << 62  # whole steps
        return reason

    def _anomaly_allowed(self, reason: str) -> bool:
        if self.step_num < self._quiet_until:
            return False
        if len(self._windows_planned) >= self.max_windows:
            self._warn_once("cap", f"anomaly not profiled, {self.max_windows} windows already ({reason})")
            return False
        used = _folder_bytes([_win.window_dir(self.out_dir, p.first) for p in self._windows_planned])
        if used >= self.max_window_bytes:
            self._warn_once("disk", f"anomaly not profiled, the windows hold {used / 2**20:.0f} MiB ({reason})")
            return False
        return True

    def _plan_window(self, request, reason: str | None, fixed_end: int | None, durations: list[float]) -> None:
        # the lead is counted in steps of the time they take now (a slowdown's, not the baseline's)
        now_s = self._rule.recent_step_s() if self._rule is not None and reason is not None else None
        if now_s is None and durations:
            now_s = sorted(durations)[len(durations) // 2]
        if request is not None and self._fast_s:
            # steps can get faster within the lead (the load that slowed them, e.g. the trigger's own
            # start-up, ends): counted in the fastest recent steps, the lead still covers the poll period
            now_s = min(now_s or float("inf"), min(self._fast_s))
        # alone, the coordinator needs no time to tell other ranks: the window starts after one warm-up step
        lead = _win.lead_steps(now_s) if self.world_size > 1 else 1
        start = max(self.step_num + lead, (fixed_end or 0) + 1)
        decided = {"decided_step": self.step_num, "decided_unix": round(time.time(), 3)}
        if request is not None:
            n, requested = request
            plan = _win.Plan(seq=self._seq + 1, first=start, steps=n, why="demand", requested=requested,
                             reason="requested with `fsdpdoctor trigger`" + (f" at {requested}" if requested else ""),
                             **decided)
        else:
            plan = _win.Plan(seq=self._seq + 1, first=start, steps=self.window_steps, why="anomaly", reason=reason,
                             **decided)
        if self.world_size > 1:
            self._board.publish(plan)
        self._seq = plan.seq
        self._windows_planned.append(plan)
        self._plan, self._window_at = plan, plan.first - 1

    def _read_trigger(self) -> tuple[int, str | None] | None:
        """The request to honour now, once: a request is recognised by its id (a file without one by its
        inode and time), so one the job cannot remove (a sticky folder, another user's file) is taken
        once, named in a warning, and recorded for ``fsdpdoctor trigger``; never taken again."""
        path = self.out_dir / _win.TRIGGER_NAME
        try:
            os.lstat(path)
        except OSError:
            return None
        request, problem = _win.read_request(path)
        key = _win.request_key(path, request)
        if key in self._requests_seen:
            return None
        self._requests_seen.add(key)
        if problem is not None:
            rejected = path.with_name(path.name + _win.REJECTED_SUFFIX)
            try:
                os.replace(path, rejected)
                _warn(f"rank {self.rank}: {path} ignored: {problem} (moved to {rejected.name})")
            except OSError as exc:
                _warn(f"rank {self.rank}: {path} ignored: {problem}; cannot move it aside ({exc.strerror or exc}), "
                      "it is not read again")
            return None
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._requests_kept.append(key)
            _warn(f"rank {self.rank}: {path} (request {request.id or key}) taken, but it cannot be removed "
                  f"({exc.strerror or exc}): it is not taken again; its owner can remove it")
            try:
                _win.write_taken(self.out_dir, self._requests_kept)
            except OSError:
                pass
        return request.steps, request.requested

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
            self._report_part(plan, f"learned of the window at step {self.step_num}, after its warm-up step "
                                    f"{plan.first - 1}")

    def _open_window(self) -> None:
        plan, self._window_at = self._plan, -1
        if plan is None or (self.ranks is not None and self.rank not in self.ranks):
            return
        if self._prof is not None:
            self._warn_once(f"busy:{plan.seq}", f"window-{plan.first} skipped: the fixed schedule's profiler runs")
            self._part_why = "skipped: the fixed schedule's profiler was running"
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
            self._part_why = f"its profiler did not start ({type(exc).__name__})"
            self._wprof = None
            self._unsilence()

    def _on_window_ready(self, prof) -> None:
        plan = self._plan
        if plan is not None and self.step_num < plan.first:
            return  # stopped in the warm-up step: the job ended before the window (see _end_window)
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
        if self.step_num < plan.first:
            self._window_not_reached(plan)
            return
        done = list(range(plan.first, min(plan.last, self.step_num - 1) + 1))
        if self._wexported and self.rank == self.manifest_rank:
            # written once every other profiled rank reported its part (at a later poll, or at close)
            self._pending_manifests.append((plan, done, partial))
        self._plan_done(plan)
        if self._pending_manifests:
            self._write_ready_manifests()

    def _window_not_reached(self, plan: _win.Plan) -> None:
        """The job ended before the window's first step: nothing of it is written, and a folder made for
        it is removed (never a folder holding only a manifest); the coordinator says so."""
        self._plan_done(plan)
        self._windows.pop()
        try:
            _win.window_dir(self.out_dir, plan.first).rmdir()   # only when empty
        except OSError:
            pass
        if self.rank == 0:
            _warn(f"rank 0: window-{plan.first} ({plan.why}, decided at step {plan.decided_step}) not profiled: "
                  f"the job ended at step {self.step_num}, before it; no folder written")

    def _plan_done(self, plan: _win.Plan) -> None:
        self._report_part(plan, _win.PART_WRITTEN if self._wexported else
                          self._part_why or "no trace written (see this rank's warnings)")
        self._plan, self._window_at, self._part_why = None, -1, None
        self._wexported = False
        self._windows.append({"first": plan.first, "last": plan.last, "why": plan.why, "reason": plan.reason})
        # the window's steps and the one after it are slower by design: the rule starts afresh after them
        self._feed_from = plan.last + 2
        self._quiet_until = plan.last + 1 + self.cooldown_steps
        if self._rule is not None:
            self._rule.reset()

    _part_why: str | None = None
    _pending_manifests: list

    def _report_part(self, plan: _win.Plan, status: str) -> None:
        """Tell the manifest rank whether this rank's trace of the window is on disk (or why not)."""
        if self.rank == self.manifest_rank or self.rank not in self.profiled_ranks or self._board is None:
            return
        try:
            self._board.report_part(plan.seq, self.rank, status)
        except Exception as exc:
            self._warn_once(f"part:{plan.seq}", f"cannot report on window-{plan.first} ({exc})")

    def _write_ready_manifests(self, wait_s: float = 0.0) -> None:
        """Write the manifests of the windows every other profiled rank has reported on; with ``wait_s``
        (at close), every one, after waiting at most that long in all: a rank with no report by then is
        named as missing. A manifest lists only the traces that are on disk, and names every rank whose
        trace is not, with the reason that rank gave."""
        others = [r for r in self.profiled_ranks if r != self.rank] if self._board is not None else []
        deadline = time.monotonic() + wait_s
        kept = []
        for plan, done, partial in self._pending_manifests:
            parts = self._board.parts(plan.seq, others) if others else {}
            while len(parts) < len(others) and time.monotonic() < deadline:
                time.sleep(0.05)
                parts = self._board.parts(plan.seq, others)
            if len(parts) < len(others) and not wait_s:
                kept.append((plan, done, partial))
                continue
            if len(parts) < len(others):
                parts = self._board.parts(plan.seq, others, one_by_one=True)
            missing = {r: parts.get(r, "no report from this rank by the end of the job")
                       for r in others if parts.get(r) != _win.PART_WRITTEN}
            try:
                self._write_json(_win.window_dir(self.out_dir, plan.first) / "manifest.json",
                                 self._window_manifest(plan, done, partial, missing))
            except Exception as exc:
                _warn(f"rank {self.rank}: cannot write the manifest of window-{plan.first} ({exc})")
        self._pending_manifests = kept

    def _window_manifest(self, plan: _win.Plan, done: list[int], partial: int | None,
                         missing: dict[int, str]) -> dict:
        m = self.manifest()
        pr = [r for r in self.profiled_ranks if r not in missing]
        m.update({
            "files": {str(r): f"rank{r}.json.gz" for r in pr},
            "cycle_files": {str(r): [f"rank{r}.json.gz"] for r in pr},
            # profiled ranks whose trace of this window is not in its folder, and why (docs/capture.md)
            "missing_ranks": {str(r): why for r, why in sorted(missing.items())},
            "schedule": {"skip_first": plan.first - 1, "wait": 0, "warmup": 1, "active": plan.steps, "repeat": 1},
            "profiled_steps": done,
            "partial_steps": [partial] if partial is not None else [],
            "window": {"first_step": plan.first, "last_step": plan.last, "steps": plan.steps,
                       "trigger": plan.why, "reason": plan.reason, "requested": plan.requested,
                       "decided_at_step": plan.decided_step, "decided_unix": plan.decided_unix},
        })
        return m
