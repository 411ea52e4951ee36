"""The compiled scanner as an install meets it: its sources build without a warning under
``-Wall -Wextra -Werror`` (where a C compiler exists), and an install without it says so, once per
command on stderr and in ``--version``, while the library says nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bundled import TRACES

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "fsdpdoctor" / "trace"
# the scanner hidden as on an install that could not build it: its import fails
WITHOUT = "import sys; sys.modules['fsdpdoctor.trace._scan'] = None\n"


def _compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc")


@pytest.mark.skipif(_compiler() is None, reason="no C compiler here: the scanner is optional")
def test_the_scanner_builds_without_a_warning(tmp_path):
    """Built from the sources into a temporary folder, strictly, then loaded and run on a real trace's
    events: the same columns as the installed scanner's."""
    built = tmp_path / f"_scan{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    cmd = [_compiler(), "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include}",
           str(SOURCES / "_scan.c"), "-o", str(built)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    check = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("fsdpdoctor.trace._scan", {str(built)!r})
scan = importlib.util.module_from_spec(spec); spec.loader.exec_module(scan)
sys.modules["fsdpdoctor.trace._scan"] = scan
from fsdpdoctor.trace import columns, loader, split
assert columns._scan is scan.scan
data = loader.inflate(open({str(TRACES / 'ddp_default' / 'rank0.json.gz')!r}, "rb").read(), "")
start, end = split.events_span(data)
got = columns.from_bytes(data[start + 1:end])
print(len(got.ts), got.names[:3])
"""
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    from fsdpdoctor.trace import columns, loader, split

    data = loader.inflate((TRACES / "ddp_default" / "rank0.json.gz").read_bytes(), "")
    start, end = split.events_span(data)
    mine = columns.from_bytes(data[start + 1:end])
    assert out.stdout.strip() == f"{len(mine.ts)} {mine.names[:3]}" and len(mine.ts) > 1000


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO), FSDPDOCTOR_NO_SCANNER=""))


CLI = "import sys\nfrom fsdpdoctor.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _installed_without_the_scanner(tmp_path: Path) -> Path:
    """A copy of the package as an install that could not build the scanner leaves it: no _scan*.so."""
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "fsdpdoctor", site / "fsdpdoctor",
                    ignore=shutil.ignore_patterns("_scan*.so", "_scan*.pyd", "__pycache__"))
    return site


def test_without_the_scanner_a_command_says_so_once(tmp_path):
    run = str(TRACES / "ddp_one_bucket")
    env = dict(os.environ, PYTHONPATH=str(_installed_without_the_scanner(tmp_path)), FSDPDOCTOR_NO_SCANNER="")
    plain = subprocess.run([sys.executable, "-m", "fsdpdoctor", "analyze", run, "--json"], capture_output=True,
                           text=True, timeout=300, env=env, cwd=tmp_path)
    scanned = _python(CLI, "analyze", run, "--json")
    assert plain.returncode == scanned.returncode == 0, plain.stderr
    said = [line for line in plain.stderr.splitlines() if "scanner" in line]
    assert said == ["fsdpdoctor: trace scanner not built (no C compiler at install): traces are read by msgspec, "
                    "more slowly"]
    assert "scanner" not in scanned.stderr
    assert json.loads(plain.stdout) == json.loads(scanned.stdout)   # stdout stays the document


def test_version_names_the_scanner_state():
    without = _python(WITHOUT + CLI, "--version")
    built = _python(CLI, "--version")
    assert without.returncode == built.returncode == 0
    assert without.stdout.splitlines()[1].startswith("trace scanner: not built")
    assert built.stdout.splitlines()[1] == "trace scanner: compiled"
    assert built.stdout.splitlines()[0].startswith("fsdpdoctor ")


def test_the_library_says_nothing_about_the_scanner():
    """A program that calls the library keeps its stderr: the notice belongs to the command line."""
    got = _python(WITHOUT + f"import fsdpdoctor\nr = fsdpdoctor.analyze({str(TRACES / 'ddp_one_bucket')!r})\n"
                  "print(len(r.ranks) > 0)")
    assert got.returncode == 0 and got.stdout.strip() == "True", got.stderr
    assert got.stderr == ""
