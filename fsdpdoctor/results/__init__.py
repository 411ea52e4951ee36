"""The typed results, one package: what the analysis returns (``analysis``: ``Analysis`` and its parts,
the one severity order) and its pandas views (``frames``).

Every result type is importable from here (``from fsdpdoctor.results import Analysis, Finding``).
"""

from fsdpdoctor.results.analysis import *  # noqa: F401,F403 - the face of the package
