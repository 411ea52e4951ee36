"""The slowdown detector behind automatic windows (``capture(auto=True)``, docs/capture.md).

What it judges is the job's *own* time per step: the step less the share of it the ranks spent
waiting for a CPU (runnable, not running: ``/proc/thread-self/schedstat``). A load spike from other
processes hits every rank on a machine together and shows up as that wait; one rank that is slower
(it sleeps, loads, computes more) is slow in its own time, and the others' wait for it is not a CPU
wait. On a shared machine the wait can be two thirds of the step: measured there (2 ranks, gloo,
load 6-13 on 2 cores), the step's wall time rose 2.1x for 9 steps in a healthy run, its own time
1.7x at most, while a rank sleeping one healthy step more raised it 5.6x.

Three parts, each derived from the run's own steps:

* **Baseline**: the median of the last ``BASELINE_STEPS`` healthy own times. Slow steps never
  enter it, so a slowdown cannot drag it up before it is judged; its length makes it follow slow
  drift without following a sudden change.
* **Level**: a step is *slow* when its own time is ``level`` x the baseline or more. ``level`` lies
  halfway, in log scale, between the largest sustained slowdown healthy noise produced in this run
  (the highest median of ``WINDOW`` consecutive judged steps over the last ``NOISE_STEPS``; before
  ``NOISE_MIN`` were judged, ``NOISE_PRIOR``) and ``TARGET``, the slowdown a window must catch (2x:
  issue 28), and is at least ``1 + min_rise``. So the noise can never reach it and the target always
  does, unless the run's own noise already reached 2x (then its windows miss 2x slowdowns, and the
  reason says what the level is).
* **Persistence**: a window opens when ``need`` of the last ``2 need - 1`` judged steps are slow, the
  latest among them. ``need`` is at least ``NEED`` (the median of ``WINDOW`` steps, as long as the
  noise was measured over) and is the least count for which the slow steps of the run's own noise
  would do that less often than ``FALSE_RATE`` per step: slow steps come in bursts (starting at rate
  r, ``burst`` steps long on average), so ``need`` slow steps take about ``need / burst`` bursts among
  ``2 need - 1`` steps, whose chance is at most ``C(2 need - 1, bursts) r^bursts``. It stays at most
  ``MAX_NEED``, so that a sustained 2x slowdown is decided within ``2 MAX_NEED - 1`` steps; until
  ``NOISE_MIN`` steps were judged, too few to know the bursts, it is ``MAX_NEED``. A median counts as
  noise only once the ``2 MAX_NEED - 1`` steps after it decided nothing.

Pure Python, no torch; the coordinator feeds it the steps completed since its last poll (nothing
per step), and it tells the coordinator how many more slow steps would decide, so that the
training loop can ask for a poll at once (one comparison per step) and the window starts promptly.
"""

from __future__ import annotations

import math
from collections import deque

BASELINE_STEPS = 256   # healthy steps the baseline holds
REFERENCE_STEPS = 30   # healthy steps needed before any step is judged
TARGET = 2.0           # the slowdown a window must catch (a sustained 2x slowdown of one rank)
NOISE_PRIOR = 1.5      # sustained noise assumed until NOISE_MIN steps were judged (a loaded machine's)
MIN_RISE = 0.10        # default least slowdown worth a window (10 % above the median)
WINDOW = 9             # steps the noise is judged over (a median of WINDOW steps)
NEED = WINDOW // 2 + 1 # least slow steps that decide (the median of WINDOW steps)
MAX_NEED = 9           # most: a sustained slowdown is decided within 2 MAX_NEED - 1 = 17 steps
FALSE_RATE = 1e-6      # wanted chance per step that healthy noise opens a window
NEED_EVERY = 32        # judged steps between two estimates of the persistence
NOISE_STEPS = 1000     # judged steps the noise is measured over
NOISE_MIN = 200        # fewer judged steps than this: the noise is not known yet, NOISE_PRIOR
MAX_WAIT_SHARE = 0.95  # a CPU wait share above this is not believed (clock or counter glitch)


def _median(xs) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def level_for(noise: float, min_rise: float = MIN_RISE) -> float:
    """The ratio to the baseline at which a step is slow: the geometric midpoint of the sustained
    noise and TARGET, at least 1 + min_rise."""
    return max(1.0 + min_rise, math.sqrt(TARGET * max(noise, 1.0)))


def persistence(rate: float, burst: float) -> int:
    """Least ``need`` in NEED..MAX_NEED for which bursts of slow steps starting at ``rate`` per step,
    ``burst`` steps long on average, put ``need`` slow steps among ``2 need - 1`` less often than
    FALSE_RATE per step; MAX_NEED when none does."""
    for need in range(NEED, MAX_NEED + 1):
        bursts = max(1, math.ceil(need / max(burst, 1.0)))
        n = 2 * need - 1
        if bursts > n or math.comb(n, bursts) * rate ** bursts <= FALSE_RATE:
            return need
    return MAX_NEED


def cpu_wait_ns() -> int | None:
    """Nanoseconds the calling thread has spent runnable but waiting for a CPU (Linux schedstat);
    None where the kernel does not say (then no step is corrected)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def own_times(durations: list[float], wait_share: float) -> list[float]:
    """The steps less the share of them the ranks waited for a CPU."""
    keep = 1.0 - min(max(wait_share, 0.0), MAX_WAIT_SHARE)
    return [d * keep for d in durations]


class _Scale:
    """Baseline, level and noise of one measure of the step (its whole time, or its own time)."""

    def __init__(self, min_rise: float):
        self.min_rise = min_rise
        self.baseline: deque[float] = deque(maxlen=BASELINE_STEPS)
        self.noise: deque[float] = deque(maxlen=NOISE_STEPS)   # medians of WINDOW judged steps, as ratios
        self._ratios: deque[float] = deque(maxlen=WINDOW)
        self._pending: deque[float] = deque(maxlen=2 * MAX_NEED)   # medians not yet counted as noise
        self.median = 0.0
        self.level = level_for(NOISE_PRIOR, min_rise)
        self.limit: float | None = None

    def reset(self) -> None:
        self.baseline.clear()
        self.forget_recent()
        self.limit = None

    def forget_recent(self) -> None:
        self._ratios.clear()
        self._pending.clear()

    def sustained_noise(self) -> float:
        """The largest median of WINDOW judged steps over the baseline (NOISE_PRIOR until NOISE_MIN)."""
        return max(self.noise) if len(self.noise) >= NOISE_MIN else NOISE_PRIOR

    def refresh(self) -> None:
        self.median = _median(self.baseline)
        self.level = level_for(self.sustained_noise(), self.min_rise)
        self.limit = self.level * self.median

    def judge(self, d: float, deciding: bool) -> bool:
        """Whether ``d`` is slow on this scale; a healthy step joins the baseline, and the median of the
        last WINDOW ratios joins the noise once the steps after it decided nothing."""
        slow = d >= self.limit
        if not slow:
            self.baseline.append(d)
        self._ratios.append(d / self.median if self.median > 0 else 1.0)
        if not deciding and len(self._ratios) == WINDOW:
            self._pending.append(_median(self._ratios))
            if len(self._pending) == self._pending.maxlen:
                self.noise.append(self._pending[0])
        return slow

    def ratio(self, ds: list[float]) -> float:
        return _median(ds) / self.median if self.median > 0 else float("inf")

    def says(self, what: str, ds: list[float]) -> str:
        noise = self.sustained_noise()
        return (f"{what} {self.ratio(ds):.1f}x its median ({self.median * 1e3:.1f} ms; level {self.level:.2f}x, "
                f"halfway between the {noise:.2f}x its noise reached"
                f"{'' if len(self.noise) >= NOISE_MIN else ' (assumed)'} and {TARGET:.0f}x)")


class SlowdownRule:
    """Feed it step durations in seconds and the share of them the ranks waited for a CPU; it returns
    the reason of a slowdown when one is decided. A step is slow when both its whole time and its own
    time (the step less that wait) are slow, each on its own baseline and level: a load spike raises
    the whole time but not the own time; an error of the measured wait (large where the wait is most
    of the step) raises the own time but not the whole time; one rank slower raises both."""

    def __init__(self, min_rise: float = MIN_RISE):
        self.min_rise = float(min_rise)
        self.whole, self.own = _Scale(self.min_rise), _Scale(self.min_rise)
        self.recent: deque[tuple[int, float, float, bool]] = deque(maxlen=2 * MAX_NEED - 1)
        self.flags: deque[bool] = deque(maxlen=NOISE_STEPS)    # slow or not, for every judged step
        self.need = NEED
        self.wait_share = 0.0              # the CPU wait share last taken out (for the reason)
        self._judged = 0
        self._need_at = -NEED_EVERY

    # the whole step's figures: what the training loop compares each step with
    @property
    def limit(self) -> float | None:
        return self.whole.limit

    @property
    def median(self) -> float:
        return self.whole.median

    @property
    def level(self) -> float:
        return self.whole.level

    def sustained_noise(self) -> float:
        return self.whole.sustained_noise()

    def reset(self) -> None:
        """Start the baselines afresh (after a window: its steps are slower by design, and what follows
        is the run's new normal). What was learnt of the noise is kept."""
        self.whole.reset()
        self.own.reset()
        self.recent.clear()

    def _refresh(self) -> None:
        self.whole.refresh()
        self.own.refresh()
        if self._judged - self._need_at >= NEED_EVERY:   # slow to change: not every poll
            self._need_at = self._judged
            self.need = (MAX_NEED if len(self.flags) < NOISE_MIN
                         else max(NEED, persistence(*self.noise_rates())))

    def noise_rates(self) -> tuple[float, float]:
        """(bursts of slow steps per step, mean burst length) of the judged steps, with one burst of one
        step added as a prior so that a short history is not taken for a quiet one."""
        slow = bursts = 0
        prev = False
        for f in self.flags:
            slow += f
            bursts += f and not prev
            prev = f
        return (bursts + 1) / (len(self.flags) + 2), (slow + 1) / (bursts + 1)

    def _window(self) -> list[tuple[int, float, float, bool]]:
        return list(self.recent)[-(2 * self.need - 1):]

    def slow_count(self) -> int:
        return sum(s for *_, s in self._window())

    def more_needed(self) -> int:
        """Slow steps still needed for a decision if every next step is slow (at least 1)."""
        return max(1, self.need - self.slow_count())

    def recent_step_s(self) -> float | None:
        """Median of the (whole) steps last judged: the step time now."""
        w = self._window()
        return _median([d for _, d, _, _ in w]) if w else None

    def feed(self, first_step: int, durations: list[float], wait_share: float = 0.0) -> str | None:
        """The reason of a slowdown when one is decided among these steps, else None."""
        found = None
        self.wait_share = wait_share
        for i, (d, o) in enumerate(zip(durations, own_times(durations, wait_share))):
            if self.whole.limit is None:
                self.whole.baseline.append(d)
                self.own.baseline.append(o)
                if len(self.whole.baseline) >= REFERENCE_STEPS:
                    self._refresh()
                continue
            deciding = found is not None
            slow = self.whole.judge(d, deciding) & self.own.judge(o, deciding)
            self._judged += 1
            self.flags.append(slow)
            self.recent.append((first_step + i, d, o, slow))
            if found is None and slow and self.slow_count() >= self.need:
                found = self._reason()
        if self.whole.limit is not None:
            self._refresh()
        if found:
            self.recent.clear()
            self.whole.forget_recent()
            self.own.forget_recent()
        return found

    def _reason(self) -> str:
        slow = [(k, d, o) for k, d, o, s in self._window() if s]
        a, b = slow[0][0], slow[-1][0]
        return (f"steps {a}-{b}: {len(slow)} of {b - a + 1} slow: "
                + self.whole.says("the step took", [d for _, d, _ in slow]) + "; "
                + self.own.says(f"its own time (less the {self.wait_share:.0%} the ranks waited for a CPU)",
                                [o for _, _, o in slow])
                + f"; {self.need} slow steps decide")


def replay(ends_ns: list[list[int]], waits_ns: list[list[int]] | None, poll_s: float, min_rise: float = MIN_RISE,
           after_window: int = 0) -> list[int]:
    """The steps at which the rule decides on a recorded run, fed as the coordinator feeds it: rank 0
    polls every ``poll_s`` at a step end and judges the steps since, less the largest CPU wait share
    of that interval on rank 0 and of the other ranks' last interval before it (they publish theirs at
    their own polls). ``ends_ns[r]``: rank r's step ends on one clock; ``waits_ns[r]``: its cumulative
    CPU wait at each (None: whole steps). After a decision the rule starts afresh ``after_window``
    steps later (a window's steps are not judged)."""
    rule, found = SlowdownRule(min_rise), []
    period = int(poll_s * 1e9)

    def polls(ends: list[int]) -> list[int]:
        out, nxt = [], ends[0] + period
        for i, t in enumerate(ends):
            if t >= nxt:
                out.append(i)
                nxt = t + period
        return out

    peer_polls = [polls(e) for e in ends_ns[1:]]
    prev, resume = 0, 0
    e0 = ends_ns[0]
    for p in polls(e0):
        share = 0.0
        if waits_ns is not None:
            span = e0[p] - e0[prev]
            shares = [(waits_ns[0][p] - waits_ns[0][prev]) / span] if span > 0 else []
            for r, pp in enumerate(peer_polls, start=1):
                seen = [k for k in pp if ends_ns[r][k] <= e0[p]][-2:]
                if len(seen) == 2 and ends_ns[r][seen[1]] > ends_ns[r][seen[0]]:
                    shares.append((waits_ns[r][seen[1]] - waits_ns[r][seen[0]])
                                  / (ends_ns[r][seen[1]] - ends_ns[r][seen[0]]))
            share = min(max(shares, default=0.0), MAX_WAIT_SHARE)
        first = max(prev + 1, resume)
        durs = [(e0[i] - e0[i - 1]) / 1e9 for i in range(first, p + 1)]
        for i, d in enumerate(durs):   # one step at a time: the decision's step is exact
            if rule.feed(first + i, [d], share):
                found.append(first + i)
                rule.reset()
                resume = first + i + 1 + after_window
                break
        prev = p
    return found
