"""fsdpdoctor: profile and diagnose PyTorch DDP/FSDP training jobs.

Data flows one way: capture -> trace files -> load (``trace``) -> analyze
(``analysis``) -> diagnose (``diagnose``) -> render (``report``, ``tui``).
Only ``fsdpdoctor.capture`` imports torch.
"""

__version__ = "0.1.0"
