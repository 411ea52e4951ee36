"""One trace, one verdict, on every machine (issue 46): what the analysing machine has installed never
changes the analysis. The same trace analysed in two interpreters, one where torchmetrics is installed
and one where it is not, gives the same JSON document (the old verdict took a package installed where
the analysis ran for a library, and one that was not for the user's code: host-sync blamed
torchmetrics/aggregation.py(77) as the user's line on a machine without torchmetrics)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bundled import TRACES  # the committed traces, in a pristine copy

ROOT = Path(__file__).resolve().parents[1]
RUN = TRACES / "gcn_metric_sync_step"   # metric sync through torchmetrics, every step
# the interpreter's own site-packages folders swapped for one given folder, before anything is imported
_ANALYSE = ("import sys; sys.path[:] = [p for p in sys.path if not p.endswith('-packages')] + [sys.argv[1]]; "
            "import fsdpdoctor; sys.stdout.write(fsdpdoctor.analyze(sys.argv[2], use_summaries=False, "
            "workers=1).to_json())")


def _installed_set(folder: Path, torchmetrics: bool) -> Path:
    """A site-packages folder holding what this interpreter's hold (links), with or without torchmetrics."""
    site = folder / "site-packages"
    site.mkdir(parents=True)
    for real in (p for p in map(Path, sys.path) if p.name.endswith("-packages") and p.is_dir()):
        for entry in real.iterdir():
            if not entry.name.startswith("torchmetrics") and not (site / entry.name).exists():
                (site / entry.name).symlink_to(entry)
    if torchmetrics:
        (site / "torchmetrics").mkdir()
        (site / "torchmetrics" / "__init__.py").write_text("")
        (site / "torchmetrics-1.4.0.dist-info").mkdir()
    return site


def test_the_packages_installed_where_the_analysis_runs_change_nothing(tmp_path):
    documents = []
    for torchmetrics in (True, False):
        site = _installed_set(tmp_path / str(torchmetrics), torchmetrics)
        out = subprocess.run([sys.executable, "-c", _ANALYSE, str(site), str(RUN)], capture_output=True, text=True,
                             timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
        assert out.returncode == 0, out.stderr[-2000:]
        documents.append(out.stdout)
    assert documents[0] == documents[1]
