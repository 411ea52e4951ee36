"""The typed results, one package, one severity scale (``SEVERITIES``): what every verb computes and
every renderer (console, JSON, JUnit, TUI) shows.

``analysis``: ``Analysis`` and its parts (``analyze``, ``check``, the TUI), with ``signals`` (the per-rank
signals it holds) and ``serial`` (the writers every result shares); ``hang``: the hang report;
``scaling``: the scaling report; ``comparison``: two runs compared (``diff``, ``check --baseline``);
``memory``: the memory prediction and measurement; ``check``: the CI gate's decision; ``steps``: a run's step series; ``frames``:
pandas views of an ``Analysis``. Every result type is importable from here.

A module is loaded when one of its names is first asked for: each holds dozens of dataclasses whose
creation costs ~1 ms apiece at start-up, and a verb needs one or two of the modules (``analyze
--json`` took 10-15 ms less to start without the memory, hang, scaling, comparison and check results).
"""

from fsdpdoctor.results.analysis import *  # noqa: F401,F403 - the face of the package, needed by every verb
from fsdpdoctor.results.serial import dumps_indented, plain  # noqa: F401
from fsdpdoctor.results.signals import *  # noqa: F401,F403 - the per-rank signals Analysis holds

# where the other names are, in the order they are looked for; a new result module adds its name here
# (docs/adding-a-verb.md), or `from fsdpdoctor.results import ItsType` does not find it
_LAZY = ("check", "comparison", "hang", "memory", "scaling", "steps", "whatif")


def __getattr__(name: str):
    import importlib

    for sub in _LAZY:
        module = importlib.import_module(f"{__name__}.{sub}")
        if not name.startswith("_") and hasattr(module, name):
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
