#!/usr/bin/env bash
# Every GPU check of docs/gpu.md in one go, on a CUDA machine that has its own torch (>= 2.11): install ptopt
# against that torch, probe AOTInductor compile-and-load, build bench_gpu's fp16 AOTInductor packages while
# the CUDA tests run, validate two of them through the CLI on the GPU, then time everything
# (benchmarks/bench_gpu.py). Run from the checkout:
#
#     bash benchmarks/gpu_session.sh            # logs and results under $OUT (default ./gpu-out)
#
# Wheels the machine lacks (torchao) may sit in .whl/: installed with --no-deps into /tmp/site, used by the
# probe's second pass, and by everything when PTOPT_GPU_SITE=1. DEADLINE (seconds, default 560) bounds the run.
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
SETUP="$OUT/setup.txt"
{ nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; lscpu; } >"$SETUP" 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$SETUP" 2>&1
    [ "${PTOPT_GPU_SITE:-0}" = 1 ] && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation ./ >>"$SETUP" 2>&1 || { tail "$SETUP"; exit 1; }
WORK=/tmp/gpu-work
mkdir -p "$WORK"
# outside the checkout: its ptopt/ folder would shadow the installed package
cd /tmp || exit 1
{ echo "# without /tmp/site"; timeout 200 python3 "$REPO/benchmarks/probe_aoti_load.py" --cuda
  echo "# with /tmp/site (torchao)"; PYTHONPATH=/tmp/site timeout 200 python3 "$REPO/benchmarks/probe_aoti_load.py" --cuda
} >"$OUT/probe.txt" 2>&1 &
PROBE=$!
timeout 330 python3 "$REPO/benchmarks/bench_gpu.py" --work "$WORK" --build-only --build-timeout 300 >"$OUT/build.txt" 2>&1 &
BUILD=$!
# pytest-xdist workers: a test that crashes its process (seen: torch 2.11's AOTInductor loader) costs that
# test, not the rest (xdist replaces the crashed worker)
rm -rf /tmp/gpu-tests && mkdir /tmp/gpu-tests && cp -r "$REPO/tests" "$REPO/pyproject.toml" /tmp/gpu-tests/
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
(cd /tmp/gpu-tests && timeout 240 python3 -X faulthandler -m pytest $XDIST -p no:cacheprovider -W default -q -rs ${PYTEST_K:+-k "$PYTEST_K"} \
    tests/export/test_export_half.py tests/export/test_aoti_cuda.py tests/validate/test_validate_device.py \
    tests/compress/test_trainer_checkpoint.py tests/serve/test_handler_device.py tests/core/test_device.py \
    >"$OUT/pytest.txt" 2>&1)
echo "pytest exit $?" >>"$OUT/pytest.txt"
wait $BUILD
echo "build exit $?" >>"$OUT/build.txt"
for f in "$WORK"/*.failed.txt; do [ -e "$f" ] && { echo "== $f"; tail -40 "$f"; } >>"$OUT/build.txt"; done
wait $PROBE
if [ -e "$WORK/resnet.pt2" ]; then
    timeout 120 python3 -m ptopt.cli.main validate ptopt.models.resnet:resnet "$WORK/resnet.pt2" "$WORK/resnet.graphs.pt2" \
        --data builtin:digits32:test --max-samples 512 --device cuda --batch-sizes 1,32 --threads 2 --min-seconds 1 \
        --json "$OUT/validate.json" >"$OUT/validate.txt" 2>&1
    echo "validate exit $?" >>"$OUT/validate.txt"
fi
LEFT=$((${DEADLINE:-560} - SECONDS))
if [ "$LEFT" -gt 60 ]; then
    timeout "$LEFT" python3 "$REPO/benchmarks/bench_gpu.py" --work "$WORK" --seconds 0.3 >"$OUT/bench.txt" 2>&1
    CODE=$?
    echo "bench exit $CODE" >>"$OUT/bench.txt"
    # only this run's results: the checkout's own are older ones
    [ "$CODE" = 0 ] && cp "$REPO"/benchmarks/results/gpu.* "$OUT/"
else
    echo "bench not run: ${LEFT} s left of DEADLINE" >"$OUT/bench.txt"
fi
tail -n 5 "$OUT"/*.txt
