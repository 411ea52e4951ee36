"""The typed results, one package, one severity scale (``SEVERITIES``): what every verb computes and
every renderer (console, JSON, JUnit, TUI) shows.

``analysis``: ``Analysis`` and its parts (``analyze``, ``check``, the TUI); ``hang``: the hang report;
``scaling``: the scaling report; ``comparison``: two runs compared (``diff``, ``check --baseline``);
``memory``: the memory prediction and measurement; ``check``: the CI gate's decision; ``frames``:
pandas views of an ``Analysis``. Every result type is importable from here.
"""

from fsdpdoctor.results.analysis import *  # noqa: F401,F403 - the face of the package
from fsdpdoctor.results.check import *  # noqa: F401,F403
from fsdpdoctor.results.comparison import *  # noqa: F401,F403
from fsdpdoctor.results.hang import *  # noqa: F401,F403
from fsdpdoctor.results.memory import *  # noqa: F401,F403
from fsdpdoctor.results.scaling import *  # noqa: F401,F403
