"""`.ci/run` runs the README's test command: the install line and the pytest call are one list."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands(line: str) -> list[str]:
    # `python -m pip install -q X` in CI is `pip install X` in the README (the quiet flag only)
    line = line.replace("python -m pip install -q ", "pip install ")
    return [c.strip() for c in line.split("&&")]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    shown = [m for m in re.findall(r"```bash\n(.*?)\n```", readme, re.S) if "pytest" in m and "pip install" in m]
    assert len(shown) == 1, "the README shows one install-and-test command"
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in ln]
    assert len(ci) == 1
    assert _commands(ci[0]) == _commands(shown[0].strip())
