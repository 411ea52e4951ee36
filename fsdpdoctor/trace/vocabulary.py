"""The trace vocabulary: the event names torch.profiler, torch.distributed and the communication
libraries write, by which a step or a communication event is recognised.

Every module that recognises one by name takes the name from here; a dialect
(``analysis/dialects``) adds its own library's names (gloo's worker spans, NCCL's kernels) on top.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fsdpdoctor.trace.table import KERNEL, MEMCPY, MEMSET, RUNTIME, category_code

# torch.profiler's annotation of step N (``prof.step()``); a step counter is a 64-bit integer, so a
# number of more than 18 digits is no step torch counted (and would not fit the summary's integers)
STEP_NAME = re.compile(r"^ProfilerStep#(\d{1,18})$")

# torch.distributed's host ops: c10d's (eager) and the functional collectives' (traced, DTensor)
C10D_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
# the profiler's record of one collective call's parameters (sizes, dtype, process group)
PARAM_COMMS = "record_param_comms"
COMM_OPS = C10D_PREFIXES + (PARAM_COMMS,)
# ops named like collectives that only wait for one
NOT_COLLECTIVE_OPS = ("c10d::wait", "_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")
# the communication libraries' own annotations (``nccl:all_reduce``, ``gloo:all_gather``; XPU's
# ProcessGroupXCCL titles its collectives ``xccl:all_reduce`` as ProcessGroupNCCL does ``nccl:``)
NCCL_ANNOTATION, GLOO_ANNOTATION, XCCL_ANNOTATION = "nccl:", "gloo:", "xccl:"
DEVICE_LIBRARY_ANNOTATIONS = (NCCL_ANNOTATION, XCCL_ANNOTATION)  # the libraries that run on the device
LIBRARY_ANNOTATIONS = (NCCL_ANNOTATION, GLOO_ANNOTATION, XCCL_ANNOTATION)
# device communication kernels are named after their library (``ncclDevKernel_...``, ``rcclKernel...``)
KERNEL_LIBRARIES = ("nccl", "rccl")
# Model-level ops whose recorded input shapes (``Input Dims``, record_shapes=True) measure how much
# work a step gives a rank: longer sequences, larger images or batches grow their first input.
SHAPED_OPS = ("aten::linear", "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::embedding", "aten::lstm",
              "aten::gru", "aten::rnn_tanh", "aten::rnn_relu", "aten::matmul", "aten::bmm",
              "aten::scaled_dot_product_attention", "aten::layer_norm")

_ALTERNATIVES = "|".join(map(re.escape, COMM_OPS + LIBRARY_ANNOTATIONS))
# names whose ``args`` the loader keeps, in any case: everything that starts like communication
# (sizes, dtypes, groups, sequence numbers), and the model-level ops (their input shapes)
_KEEP_ARGS = re.compile(rf"^({_ALTERNATIVES}|{'|'.join(KERNEL_LIBRARIES)})"
                        rf"|^(?:{'|'.join(map(re.escape, SHAPED_OPS))})$", re.I)
# a communication event: starts like a host op or an annotation, or names a library anywhere
_COMM_NAME = re.compile(rf"^({_ALTERNATIVES})|{'|'.join(KERNEL_LIBRARIES)}", re.I)


def keeps_args(name: str) -> bool:
    """Whether the loader keeps the ``args`` of events of this name (communication metadata, shapes)."""
    return _KEEP_ARGS.match(name) is not None


def reads_args(name, cat) -> bool:
    """Whether the loader decodes this complete event's ``args`` (the sanitizer checks exactly those):
    communication metadata, and the correlation id of device and runtime events."""
    return keeps_args(name) or category_code(cat) in (KERNEL, RUNTIME, MEMCPY, MEMSET)


# _COMM_NAME of an ASCII name, lowered: its prefixes and libraries by str methods (the re.I search
# tried every position of every distinct name, 300-character kernels included: 4x slower)
_COMM_PREFIXES = tuple(p.lower() for p in COMM_OPS + LIBRARY_ANNOTATIONS)


def is_comm_name(name: str) -> bool:
    """Whether an event of this name is communication (an op, an annotation or a kernel)."""
    if name.isascii():   # else case folding may differ from str.lower: the pattern decides
        low = name.lower()
        return low.startswith(_COMM_PREFIXES) or any(lib in low for lib in KERNEL_LIBRARIES)
    return _COMM_NAME.search(name) is not None


def found_in(pattern: re.Pattern, needles: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether ``pattern`` (re.I, its letters in lower case) occurs in a name: an ASCII name is lowered
    and searched case-sensitively, the same answer 2-4x faster on 300-character C++ kernel names (a
    case-insensitive search tries every position: 30 -> 13 ms for these three on the v100 and ResNet
    kernel names); any other name, whose case folding may differ from ``str.lower``, as written.
    ``needles``: words one of which every match holds; a lowered name with none of them is no match
    without a search (most kernel names: the search still tried every position, ~45 M instructions of
    `analyze` on v100 for analysis.collectives' three and ``is_comm_name``)."""
    if pattern.pattern != pattern.pattern.lower() or not pattern.flags & re.I:
        raise ValueError(f"not a lower-case re.I pattern: {pattern.pattern}")
    folded = re.compile(pattern.pattern)

    def found(name: str) -> bool:
        if not name.isascii():
            return pattern.search(name) is not None
        low = name.lower()
        for needle in needles:
            if needle in low:
                return folded.search(low) is not None
        return False

    return found
