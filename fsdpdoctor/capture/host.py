"""The host the manifest rank ran on, as the fixes need it (diagnose/settings.py sizes loader workers from
it): the cores this process may run on, the memory, how many ranks of the job share the host, and the
load the capture saw. Every reading is cheap and none can fail the job: what cannot be read is null."""

from __future__ import annotations

import os
import sys


def _cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))   # what the job may use (taskset, cgroups' cpusets), not the machine's
    except (AttributeError, OSError):
        return os.cpu_count()


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key in ("MemTotal", "MemAvailable") and parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _ranks_here(hosts: dict[str, str | None], rank: int) -> int | None:
    """Ranks on this rank's host: the launcher's LOCAL_WORLD_SIZE, else the ranks that named the same host."""
    try:
        local = int(os.environ["LOCAL_WORLD_SIZE"])
        if local > 0:
            return local
    except (KeyError, ValueError):
        pass
    mine = hosts.get(str(rank))
    if mine is None:
        return None
    return sum(1 for h in hosts.values() if h == mine) or None


def host_facts(hosts: dict[str, str | None], rank: int) -> dict:
    """The manifest's ``host`` block (docs/manifest.md)."""
    mem = _meminfo()
    if "MemTotal" not in mem:
        try:
            mem["MemTotal"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {"cores": _cores(), "memory_bytes": mem.get("MemTotal"), "memory_available_bytes": mem.get("MemAvailable"),
            "ranks_per_host": _ranks_here(hosts, rank), "load_1m": load}


def framework_record(name: str, *packages: str) -> dict:
    """The manifest's ``framework`` block: the framework whose callback captured the run, with the versions of
    its packages (a fix is written in that framework's terms)."""
    from importlib import metadata

    versions = {}
    for p in packages:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions[p] = None
    return {"name": name, "versions": versions}


def loop_framework() -> dict | None:
    """The framework of a loop captured by ``capture()`` itself: Accelerate where its state is set up in this
    process (the user's loop over ``accelerator.prepare``d objects); None for a plain loop. Only modules the
    job already imported are looked at."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    return framework_record("accelerate", "accelerate") if shared else None
