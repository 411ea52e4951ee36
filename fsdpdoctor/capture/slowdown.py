"""The slowdown detector behind automatic windows (``capture(auto=True)``, docs/capture.md).

Three parts, each derived from the run's own steps rather than from a fixed guess:

* **Baseline**: the median and the robust spread (1.4826 x MAD) of the last ``BASELINE_STEPS``
  healthy steps. Slow steps never enter it, so a slowdown cannot drag the baseline up before it is
  judged; its length makes it follow slow drift (a change of x % over a hundred steps moves it by
  about x %) without following a sudden change.
* **Limit**: a step is *slow* above ``median + max(min(SIGMAS x spread, MAX_RISE x median),
  min_rise x median)``. The spread term is capped so that a step twice the median is always slow:
  a noisier run gets a longer persistence (below) instead of a blind limit.
* **Persistence**: a window opens when ``need`` of the last ``2 need - 1`` steps are slow and the
  latest is. ``need`` outlasts the slow bursts seen among the last ``NOISE_STEPS`` steps judged
  (half again as many slow steps as any ``2 need - 1`` of them held, plus one), and is at least the
  count for which healthy noise would do that less often than
  ``FALSE_RATE`` per step, measured on the last ``NOISE_STEPS`` steps judged: slow steps come in
  bursts (starting at rate r, ``burst`` steps long on average), so ``need`` slow steps take about
  ``need / burst`` bursts among ``2 need - 1`` steps, whose chance is at most
  ``C(2 need - 1, bursts) r^bursts``. ``need`` stays within ``MIN_NEED..MAX_NEED`` so that a
  sustained slowdown is found within ``2 MAX_NEED - 1`` steps whatever the noise; until ``NOISE_MIN``
  steps were judged, too few to know the bursts, ``need`` is ``MAX_NEED``.

Pure Python, no torch; the coordinator feeds it the steps completed since its last poll (nothing
per step), and it tells the coordinator how many more slow steps would decide, so that the
training loop can ask for a poll at once (one comparison per step) and the window starts promptly.
"""

from __future__ import annotations

import math
from collections import deque

BASELINE_STEPS = 256   # healthy steps the baseline holds
REFERENCE_STEPS = 30   # healthy steps needed before any step is judged
SIGMAS = 4.0
MIN_RISE = 0.10        # default least slowdown worth a window (10 % above the median)
MAX_RISE = 0.5         # the noise term never puts the limit above 1.5x the median
FALSE_RATE = 1e-6      # wanted chance per step that healthy noise opens a window
MIN_NEED, MAX_NEED = 3, 16
NOISE_STEPS = 1000     # steps the rate and length of healthy slow bursts are measured over
NOISE_MIN = 200        # fewer steps judged than this: too few to know the bursts, MAX_NEED
NEED_EVERY = 32        # steps judged between two estimates of the persistence


def _median(xs) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def persistence(rate: float, burst: float) -> int:
    """Least ``need`` in MIN_NEED..MAX_NEED for which bursts of slow steps starting at ``rate`` per
    step, ``burst`` steps long on average, put ``need`` slow steps among ``2 need - 1`` less often
    than FALSE_RATE per step; MAX_NEED when none does."""
    for need in range(MIN_NEED, MAX_NEED + 1):
        bursts = max(1, math.ceil(need / max(burst, 1.0)))
        n = 2 * need - 1
        if bursts > n or math.comb(n, bursts) * rate ** bursts <= FALSE_RATE:
            return need
    return MAX_NEED


class SlowdownRule:
    """Feed it step durations (seconds); it returns the reason of a slowdown when one is decided."""

    def __init__(self, min_rise: float = MIN_RISE):
        self.min_rise = float(min_rise)
        self.baseline: deque[float] = deque(maxlen=BASELINE_STEPS)
        self.noise: deque[bool] = deque(maxlen=NOISE_STEPS)     # slow or not, for every step judged
        self.recent: deque[tuple[int, float, bool]] = deque(maxlen=2 * MAX_NEED - 1)
        self.median = 0.0
        self.limit: float | None = None    # None until REFERENCE_STEPS healthy steps were seen
        self.need = MAX_NEED
        self._judged = 0       # steps judged so far
        self._need_at = -1     # self._judged when need was last estimated

    def reset(self) -> None:
        """Start the baseline afresh (after a window: its steps are slower by design, and what follows
        is the run's new normal). What was learnt of the noise is kept."""
        self.baseline.clear()
        self.recent.clear()
        self.limit = None

    # ------------------------------------------------------------------ the three parts
    def _refresh(self) -> None:
        med = _median(self.baseline)
        spread = 1.4826 * _median([abs(d - med) for d in self.baseline])
        self.median = med
        self.limit = med + max(min(SIGMAS * spread, MAX_RISE * med), self.min_rise * med)
        if self._judged - self._need_at >= NEED_EVERY or self._need_at < 0:  # slow to change: not every poll
            self._need_at = self._judged
            self.need = MAX_NEED if len(self.noise) < NOISE_MIN else max(persistence(*self.noise_rates()),
                                                                          self._outlasting())

    def _outlasting(self) -> int:
        """Least ``need`` that outlasts the slow bursts the judged steps held: half again as many slow
        steps as the most that any ``2 need - 1`` consecutive steps held, plus one."""
        flags = list(self.noise)
        pre = [0]
        for f in flags:
            pre.append(pre[-1] + f)
        for need in range(MIN_NEED, MAX_NEED + 1):
            n = min(2 * need - 1, len(flags))
            most = max((pre[i + n] - pre[i] for i in range(len(flags) - n + 1)), default=0)
            if need >= 1.5 * most + 1:
                return need
        return MAX_NEED

    def noise_rates(self) -> tuple[float, float]:
        """(bursts of slow steps per step, mean burst length) of the steps judged, with one burst of one
        step added as a prior so that a short history is not taken for a quiet one."""
        slow = bursts = 0
        prev = False
        for s in self.noise:
            slow += s
            bursts += s and not prev
            prev = s
        return (bursts + 1) / (len(self.noise) + 2), (slow + 1) / (bursts + 1)

    def _window(self) -> list[tuple[int, float, bool]]:
        return list(self.recent)[-(2 * self.need - 1):]

    def slow_count(self) -> int:
        return sum(s for _, _, s in self._window())

    def more_needed(self) -> int:
        """Slow steps still needed for a decision if every next step is slow (at least 1)."""
        return max(1, self.need - self.slow_count())

    def recent_step_s(self) -> float | None:
        """Median of the steps last judged: the step time now, for the window's lead."""
        w = self._window()
        return _median([d for _, d, _ in w]) if w else None

    # ------------------------------------------------------------------ feeding
    def feed(self, first_step: int, durations: list[float]) -> str | None:
        """The reason of a slowdown when one is decided among these steps, else None."""
        found = None
        for i, d in enumerate(durations):
            if self.limit is None:
                self.baseline.append(d)
                if len(self.baseline) >= REFERENCE_STEPS:
                    self._refresh()
                continue
            slow = d > self.limit
            self._judged += 1
            self.noise.append(slow)
            self.recent.append((first_step + i, d, slow))
            if not slow:
                self.baseline.append(d)
            elif found is None and self.slow_count() >= self.need:
                found = self._reason()
        if self.limit is not None:
            self._refresh()
        if found:
            self.recent.clear()
        return found

    def _reason(self) -> str:
        slow = [(k, d) for k, d, s in self._window() if s]
        a, b = slow[0][0], slow[-1][0]
        ratio = _median([d for _, d in slow]) / self.median if self.median > 0 else float("inf")
        return (f"steps {a}-{b}: {len(slow)} of {b - a + 1} took {ratio:.1f}x the median of the "
                f"{len(self.baseline)} healthy steps before ({self.median * 1e3:.1f} ms; limit "
                f"{self.limit * 1e3:.1f} ms, {self.need} slow steps decide)")
