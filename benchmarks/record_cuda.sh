#!/usr/bin/env bash
# On a machine with one CUDA GPU (where a GPU is lent): record the CUDA fault/fix pairs of
# reference_jobs/pair_table.py (CUDA_PAIRS) with their timed runs, and the inputs of
# reference_jobs/cuda_profile_kinds.py. Needs only torch there (no fsdpdoctor dependencies).
#
#     bash benchmarks/record_cuda.sh WORK [TARDIR]
#
# PAIRS="a b" limits the pairs (PAIRS=none: the kinds only), KINDS likewise the kinds. Then, on any machine: python benchmarks/calibrate.py --device cuda --stage analyse --work WORK/pairs
# (see benchmarks/README.md). With TARDIR, each pair's folder is also packed as TARDIR/<pair>.tgz.
set -u
work=${1:?usage: record_cuda.sh WORK [TARDIR]}
tars=${2:-}
mkdir -p "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
  nproc; } > "$work/machine.txt" 2>&1
cat "$work/machine.txt"
for which in ${KINDS:-startup_in_window startup_no_steps no_cuda_activity copies_only}; do
  [ "$which" = none ] && continue
  python3 reference_jobs/cuda_profile_kinds.py --out "$work/kinds" --which $which 2>&1 | grep -v USDT
done
[ -n "$tars" ] && [ -d "$work/kinds" ] && tar czf "$tars/kinds.tgz" -C "$work" kinds machine.txt
for pair in ${PAIRS:-cuda_host_sync cuda_ddp_world_size_1 cuda_offload cuda_loader_workers cuda_recompute cuda_readback cuda_pageable_copy cuda_launch_bound}; do
  [ "$pair" = none ] && continue
  python3 benchmarks/calibrate.py --device cuda --stage record --work "$work/pairs" --pairs "$pair" \
    --reps 5 --steps 20 --active 4 --json "$work/pairs/$pair.record.json" 2>&1 | grep -v USDT
  [ -n "$tars" ] && tar czf "$tars/$pair.tgz" -C "$work/pairs" "$pair" "$pair.record.json"
done
exit 0
