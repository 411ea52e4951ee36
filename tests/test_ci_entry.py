"""`.ci/run` runs the README's test command: the install line and both halves of the tests, the slow
half whatever the fast one gave, and fails when either fails."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    shown = [m for m in re.findall(r"```bash\n(.*?)\n```", readme, re.S) if "pytest" in m and "pip install" in m]
    assert len(shown) == 1, "the README shows one install-and-test command"
    return [ln.strip() for ln in shown[0].strip().splitlines()]


def _ci_lines() -> list[str]:
    """.ci/run from its install line on; `python -m pip install -q X` there is `pip install X` in the
    README, and the install line's `|| exit` stops CI where an install failed."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if "pip install" in ln)
    return [ln.replace("python -m pip install -q ", "pip install ").removesuffix(" || exit").strip()
            for ln in lines[start:] if ln.strip()]


def test_ci_runs_the_readme_test_command():
    block = _readme_block()
    assert _ci_lines() == block
    assert not any("&&" in ln and "pytest" in ln for ln in block), "an && would skip the slow half"


@pytest.mark.parametrize("fast,slow", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_both_halves_run_and_either_fails_the_command(fast, slow):
    """The test lines of the README, with `python` standing in for pytest: both halves run, the last
    line names both exit codes, and the command fails when either half fails."""
    tests = [ln for ln in _readme_block() if "pip install" not in ln]
    stub = (f'python() {{ case "$*" in *"not slow"*) echo "fast half ran"; return {fast};; '
            f'*) echo "slow half ran"; return {slow};; esac; }}')
    out = subprocess.run(["bash", "-c", "\n".join([stub, *tests])], capture_output=True, text=True, timeout=30)
    assert "fast half ran" in out.stdout and "slow half ran" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == f"fast tests: exit {fast}; slow tests (torchrun jobs): exit {slow}"
    assert (out.returncode == 0) == (fast == slow == 0)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_a_process_the_tests_left_running_fails_the_command_and_is_killed(tmp_path):
    """.ci/run marks every process of the tests (an exported FSDPDOCTOR_TEST_RUN) and checks at its
    end: an orphan in its own session, as a forked worker left behind would be, is found by the mark,
    named, killed, and fails the command; one that ends within the grace period does not."""
    import os
    import sys
    import time

    run = (ROOT / ".ci" / "run").read_text()
    assert "export FSDPDOCTOR_TEST_RUN=" in run and 'python .ci/leftovers.py "$FSDPDOCTOR_TEST_RUN"' in run
    mark = f"test-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, FSDPDOCTOR_TEST_RUN=mark)
    check = [sys.executable, str(ROOT / ".ci" / "leftovers.py"), mark, "--grace", "1"]
    clean = subprocess.run(check, capture_output=True, text=True, timeout=60, env=env)
    assert clean.returncode == 0 and clean.stdout.strip() == "leftover processes: none", clean.stdout
    short = subprocess.Popen(["sleep", "0.3"], env=env, start_new_session=True)
    left = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        out = subprocess.run(check, capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 1, out.stdout
        assert f"{left.pid}  sleep 300" in out.stdout and f"{short.pid} " not in out.stdout
        assert left.wait(timeout=10) == -9   # killed by the check
    finally:
        left.kill()
        left.wait()
        short.wait()
