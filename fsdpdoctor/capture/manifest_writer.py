"""The manifest writer: the run's ``manifest.json`` (docs/manifest.md) from the lowest profiled rank,
with every rank's host and device exchanged through the process group's key-value store (never a
collective). A mixin of :class:`fsdpdoctor.capture.core.Capture`, whose state it shares."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import socket
import time
import uuid
from pathlib import Path

from fsdpdoctor.capture.host import host_facts, loop_framework
from fsdpdoctor.capture.manifest import describe_model, describe_wrapping
from fsdpdoctor.capture.safety import _warn

# Longest the manifest rank waits, in all, for ranks that have not published their host yet
# (ranks publish at start, long before the manifest is written after the profiled window).
HOST_WAIT_S = 2.0


def _default_store():
    """The default process group's key-value store (private torch API), or None."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _rank_world() -> tuple[int, int, bool]:
    """(rank, world_size, has_process_group)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), True
    except Exception:
        pass
    # No process group: a plain process is rank 0 of 1; under a launcher without
    # a process group use the launcher's numbering so files do not collide.
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), False
    except ValueError:
        return 0, 1, False


def _device_of(model) -> str:
    import torch

    dev = None
    if model is not None:
        for p in model.parameters():
            dev = p.device
            break
    if dev is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            dev = torch.device("cuda", torch.cuda.current_device())
        else:
            dev = torch.device("cpu")
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        try:
            return f"cuda:{idx} ({torch.cuda.get_device_name(idx)})"
        except Exception:
            return f"cuda:{idx}"
    return str(dev)


def _unwrapped_warning(wrapping: dict, world_size: int, has_pg: bool) -> list[str]:
    """A model given without its DDP/FSDP wrapper in a job of several ranks makes the manifest say "wrapping:
    none" and hides every wrapper finding: said on stderr and in the manifest, never silently recorded."""
    if not has_pg or world_size < 2 or wrapping.get("kind") != "none":
        return []
    text = (f"the model given to capture() is not wrapped in DDP or FSDP though {world_size} ranks run: if the job "
            "wraps it, pass the wrapper (capture(model=ddp_model)); the manifest's wrapping says none")
    _warn(text)
    return [text]


class ManifestWriter:
    """Hosts and devices of every rank, and the manifest of the run or of one window."""

    def _write_json(self, path: Path, data: dict) -> None:
        """Atomically, through a temp name of this writer; no temp file is left behind on failure."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial.json")
        try:
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _store_key(self, rank: int) -> str:
        return f"fsdpdoctor.capture/{self._key_dir}/host/{rank}"

    def _gather_hosts(self) -> None:
        """Publish this rank's (host, device); see the module docstring."""
        host = socket.gethostname()
        try:
            device = _device_of(self.model)
        except Exception:
            device = None
        self._hosts[str(self.rank)], self._devices[str(self.rank)] = host, device
        self._store = _default_store() if self._has_pg else None
        if self._store is not None:
            try:
                self._store.set(self._store_key(self.rank), json.dumps([host, device]))
            except Exception as exc:
                _warn(f"rank {self.rank}: cannot publish host/device ({exc})")
                self._store = None

    def _collect_hosts(self) -> None:
        """Read the other ranks' (host, device) from the store, waiting at most HOST_WAIT_S in all."""
        if self._store is None:
            return
        deadline = time.monotonic() + HOST_WAIT_S
        for r in range(self.world_size):
            if str(r) in self._hosts:
                continue
            key = self._store_key(r)
            try:
                while not self._store.check([key]):
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
                else:
                    self._hosts[str(r)], self._devices[str(r)] = json.loads(self._store.get(key))
            except Exception:
                continue

    def manifest(self) -> dict:
        import torch

        try:
            import torch.distributed as dist

            backend = dist.get_backend() if self._has_pg else None
        except Exception:
            backend = None
        nccl = None
        try:
            if torch.cuda.is_available():
                v = torch.cuda.nccl.version()
                nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        from fsdpdoctor.version import __version__

        pr = self.profiled_ranks
        self._collect_hosts()
        try:
            wrapping = describe_wrapping(self.model)
        except Exception as exc:
            _warn(f"cannot describe the model wrapping ({exc})")
            wrapping = {"kind": None}
        try:
            model = describe_model(self.model, self.optimizer)
        except Exception as exc:
            _warn(f"cannot describe the model ({exc})")
            model = describe_model(None, self.optimizer)
        return {
            "fsdpdoctor_manifest": 1,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "world_size": self.world_size,
            "backend": backend,
            "profiled_ranks": pr,
            "files": {str(r): f"rank{r}.json.gz" for r in pr},
            # every profiler cycle's file per rank, in order (the first is "files"); the manifest rank
            # writes this after its own exports, and all ranks run the same schedule
            "cycle_files": {str(r): [self._file_name(r, k) for k in range(1, max(self.cycles_exported, 1) + 1)] for r in pr},
            "versions": {"torch": torch.__version__.split("+")[0], "cuda": torch.version.cuda,
                         "nccl": nccl, "python": platform.python_version(), "fsdpdoctor": __version__},
            "hosts": {str(r): self._hosts.get(str(r)) for r in range(self.world_size)},
            "devices": {str(r): self._devices.get(str(r)) for r in range(self.world_size)},
            "schedule": {"skip_first": self.skip_first, "wait": self.wait, "warmup": self.warmup,
                         "active": self.active, "repeat": self.repeat},
            "profiled_steps": self.profiled_steps(),
            # the step the profiler was stopped in (close() inside the window): in the trace, but cut short
            "partial_steps": [self._partial_step] if self._partial_step is not None else [],
            "samples_per_step": self.samples_per_step,
            "tokens_per_step": self.tokens_per_step,
            "options": {"record_shapes": self.record_shapes, "with_stack": self.with_stack,
                        "profile_memory": self.profile_memory},
            "model": model,
            "wrapping": wrapping,
            "grad_presence": self._grads.describe(self.rank) if getattr(self, "_grads", None) is not None else None,
            "scenario": self.scenario,
            "host": host_facts(self._hosts, self.rank),
            # set by the framework callbacks (capture/hf.py, capture/lightning.py); null: a loop of the user's own
            "framework": self.framework or loop_framework(),
            "warnings": list(self.warnings) + _unwrapped_warning(
                wrapping, self.world_size, self._has_pg and self.model is not None),
            # the manifest rank's schedstat and load average over each recorded window (capture/profiling.py;
            # every rank's own is in its trace): how starved the profiled steps were
            "host_load": getattr(self, "_host_load", None),
        }

    def _write_manifest_if_mine(self) -> None:
        if self.manifest_written or self.rank != self.manifest_rank or not self.fixed_window:
            return
        self.manifest_written = True
        self._learn_folder(wait=True)
        path = self.out_dir / "manifest.json"
        try:
            self._write_json(path, self.manifest())
        except Exception as exc:
            _warn(f"rank {self.rank}: cannot write {path} ({exc}); training continues")

    def _model_param_dtype(self) -> str | None:
        return describe_model(self.model).get("param_dtype") if self.model is not None else None
