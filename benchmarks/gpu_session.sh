#!/usr/bin/env bash
# Every GPU check of docs/gpu.md in one go, on a CUDA machine that has its own torch (>= 2.11): install ptopt
# against that torch, then at once: probe AOTInductor compile-and-load (benchmarks/probe_aoti_load.py: which
# loader crashes, with a native backtrace), the CUDA-marked tests, and benchmarks/bench_gpu.py (ptopt optimize
# --device cuda on the zoo ResNet and a MiniLM-shaped encoder, every kept artifact timed against torch.compile
# fp16, validate's CUDA figure against a bare CUDA-event loop). Run from the checkout:
#
#     bash benchmarks/gpu_session.sh            # results and logs under $OUT (default ./gpu-out)
#
# $OUT receives few files (a device machine may bring back only a handful): setup.txt, probe.txt, pytest.txt,
# bench.txt, gpu.md, gpu.json and logs.tar.gz (the searches' logs and reports). Wheels the machine lacks may
# sit in .whl/: installed with --no-deps into /tmp/site, put on PYTHONPATH. DEADLINE (seconds, default 440)
# bounds the run; each step has its own timeout inside it. PROBE=0 skips the loader probe.
#
# CPU2=FILE also times the CPU test suite's node ids listed in FILE (one per line: benchmarks/select_ids.py) on 2 CPUs of the machine's
# host (taskset -c 0,1, 2 xdist workers, cold Inductor / ptopt caches, as .ci/run's suite): the same list timed on the
# development machine under the same torch gives the ratio of the two CPUs for that work (docs/benchmarks.md, "The
# test suite on another CPU"; the image's pytest-benchmark plugin refuses xdist, so it is turned off). Writes cpu2.txt
# and cpu2.xml. It runs first and alone, with the GPU hidden (CUDA_VISIBLE_DEVICES=), as on the CPU-only machines CI
# gets, and the GPU steps are skipped: run 2026-11-30 beside them (CPU2_BESIDE=1), its C++ compiles and the processes
# it starts ran 2.0-2.3x their time here while in-process tests ran 1.0x (a GPU host's processes initialise CUDA; the
# GPU steps' compiles and benchmarks share the host's caches, memory bandwidth and disk).
# CPU2_BESIDE=1 runs it beside the GPU steps, as then (one call for both, when device time is short).
set -u
REPO=$(pwd)
OUT=${OUT:-$REPO/gpu-out}
DEADLINE=${DEADLINE:-440}
WORK=/tmp/gpu-work
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
# the C++ compiler Inductor builds AOTInductor libraries with (it reads CXX): the image's CXX=/opt/gcc/bin/g++
# made libraries that crash in torch's loader (2026-11-27, H200); PTOPT_GPU_CXX (default: g++ on the PATH)
export CXX=${PTOPT_GPU_CXX:-g++} CC=${PTOPT_GPU_CC:-gcc}

finish() {
    tar czf "$OUT/logs.tar.gz" -C "$WORK" $(cd "$WORK" && ls -d *.log opt-*/report.json opt-*/summary.md 2>/dev/null) 2>/dev/null
    echo "== elapsed ${SECONDS} s"
    for f in probe pytest bench cpu2; do [ -e "$OUT/$f.txt" ] && { echo "== $f (tail)"; tail -n 25 "$OUT/$f.txt"; }; done
    [ -e "$OUT/gpu.md" ] && { echo "== gpu.md"; cat "$OUT/gpu.md"; }
}
trap finish EXIT

SETUP="$OUT/setup.txt"
{ nvidia-smi; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; lscpu | head -20; } >"$SETUP" 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >>"$SETUP" 2>&1 &&
        export PYTHONPATH=/tmp/site
fi
# editable, as .ci/run installs it: the CPU tests run from the checkout, whose ptopt/ folder then does not
# shadow the package's stages
python3 -m pip install -q --no-deps --no-build-isolation -e ./ >>"$SETUP" 2>&1 ||
    python3 -m pip install -q --no-deps --no-build-isolation ./ >>"$SETUP" 2>&1 || { tail "$SETUP"; exit 1; }
echo "setup done at ${SECONDS} s" >>"$SETUP"
PIN=""
if [ -n "${CPU2:-}" ]; then
    PIN="taskset -c 2-$(($(nproc) - 1))"
    {
        lscpu
        grep . /sys/devices/system/cpu/cpu[01]/topology/thread_siblings_list
        START=$(date +%s.%N)
        [ "${CPU2_BESIDE:-0}" != 1 ] && export CUDA_VISIBLE_DEVICES=
        PTOPT_SELECT_IDS=$(realpath "$CPU2") PYTHONPATH="$REPO/benchmarks:${PYTHONPATH:-}" TMPDIR=$(mktemp -d) \
            TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PTOPT_CACHE_DIR=$(mktemp -d) timeout $((DEADLINE - 30)) \
            taskset -c 0,1 python3 -m pytest -v -n 2 --dist loadfile -p no:cacheprovider -p no:benchmark -p select_ids \
            --junitxml="$OUT/cpu2.xml" $(cut -d: -f1 "$CPU2" | sort -u)
        echo "cpu2 exit $? wall $(python3 -c "import time; print(round(time.time() - $START, 2))") s"
    } >"$OUT/cpu2.txt" 2>&1 &
    CPU2_PID=$!
    if [ "${CPU2_BESIDE:-0}" != 1 ]; then
        wait $CPU2_PID
        exit 0
    fi
fi
# outside the checkout: its ptopt/ folder would shadow the installed package
cd /tmp || exit 1
if [ "${PROBE:-1}" = 1 ]; then
    timeout 240 $PIN python3 "$REPO/benchmarks/probe_aoti_load.py" --cuda >"$OUT/probe.txt" 2>&1 &
    PROBE_PID=$!
fi
LEFT=$((DEADLINE - SECONDS - 10))
timeout "$LEFT" $PIN python3 "$REPO/benchmarks/bench_gpu.py" --work "$WORK" --budget "${BUDGET:-270}" \
    --deadline $((LEFT - 10)) --seconds 0.3 >"$OUT/bench.txt" 2>&1 &
BENCH=$!
# the CUDA-marked tests, on pytest-xdist workers: a test that crashes its process (torch 2.11's AOTInductor
# loader did on the H100 image) costs that test, not the rest
rm -rf /tmp/gpu-tests && mkdir /tmp/gpu-tests && cp -r "$REPO/tests" "$REPO/pyproject.toml" /tmp/gpu-tests/
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
(cd /tmp/gpu-tests && timeout 240 $PIN python3 -X faulthandler -m pytest $XDIST -p no:cacheprovider -W default -q -rs -m cuda \
    ${PYTEST_K:+-k "$PYTEST_K"} tests/export/test_export_half.py tests/export/test_aoti_cuda.py \
    tests/validate/test_validate_device.py tests/compress/test_trainer_checkpoint.py tests/serve/test_handler_device.py \
    tests/core/test_device.py tests/optimize/test_optimize_cuda.py >"$OUT/pytest.txt" 2>&1)
echo "pytest exit $? at ${SECONDS} s" >>"$OUT/pytest.txt"
if [ -n "${PROBE_PID:-}" ]; then
    wait $PROBE_PID
    echo "probe exit $? at ${SECONDS} s" >>"$OUT/probe.txt"
fi
wait $BENCH
CODE=$?
echo "bench exit $CODE at ${SECONDS} s" >>"$OUT/bench.txt"
[ -n "${CPU2_PID:-}" ] && wait $CPU2_PID
# only this run's results: the checkout's own are older ones
[ "$CODE" = 0 ] && cp "$REPO"/benchmarks/results/gpu.md "$REPO"/benchmarks/results/gpu.json "$OUT/"
exit 0
