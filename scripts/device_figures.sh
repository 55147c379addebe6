#!/usr/bin/env bash
# The GPU and many-core figures of docs/speed.md and docs/ray.md, in one call on a lent GPU machine (16 cores, one
# GPU, no network): the CUDA tests, the engines per update and in whole runs on the GPU against a raw loop on the same
# GPU, the same machine's CPU for reference, and the Ray executor on 8 CPU trainers and on GPU workers. Each step has
# its own time limit (a step that fails or runs out does not stop the others; `timeout` sends SIGTERM, which a run
# answers at its next event, then SIGKILL 20 s later) and writes its whole log to $OUT; the reply shows each log's
# end. The steps took 8-9 minutes on an H200 machine (28 November), but their limits add up to more than one call may
# run (10 minutes): on a short loan, run them in two calls, the GPU steps first:
#   STEPS="tests engines_cuda whole_cuda engines_cpu" bash scripts/device_figures.sh    # at most 7 minutes
#   STEPS="ray_cpu8 ray_cpu8_fedasmu ray_gpu" bash scripts/device_figures.sh            # at most 9 minutes
#
# Packages the machine's image lacks travel in .whl (listed in .git/info/exclude, carried with the call): jsonschema
# and its needs, and jsonargparse, as cp312 wheels (`pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 -d .whl jsonschema jsonschema-specifications referencing rpds-py jsonargparse`), and
# Ray's cp312 wheel unpacked without its Java jars and source maps, as .whl/ray-site.tar.xz (31 MB; the wheel, 79 MB,
# is over the transfer limit). Figures of 28 November: docs/speed.md ("On a GPU") and docs/ray.md ("A 16-core machine").
#
#   bash scripts/device_figures.sh            # OUT=<folder> for the logs (default /tmp/device_figures)
#   STEPS="engines_cuda ray_cpu8" bash scripts/device_figures.sh     # only these steps
set -u
OUT=${OUT:-/tmp/device_figures}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    if [ -f .whl/ray-site.tar.xz ]; then tar xJf .whl/ray-site.tar.xz -C /tmp/site; fi
fi
export PYTHONPATH="$PWD:$PWD/scripts:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch, lightning; print(sys.version.split()[0], torch.__version__, lightning.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA', torch.get_num_threads(), 'threads')"
python3 -c "import ray; print('ray', ray.__version__)" || echo "no Ray: the Ray steps will fail"

step() {  # step NAME SECONDS LINES COMMAND...: run COMMAND with a time limit, log to $OUT/NAME.log, show its end
    local name=$1 limit=$2 lines=$3 start
    shift 3
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
    start=$(date +%s)
    timeout -k 20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: rc=$? in $(($(date +%s) - start))s (limit ${limit}s)" | tee -a "$OUT/steps.log"
    tail -n "$lines" "$OUT/$name.log"
}

step tests 120 6 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py
step engines_cuda 60 9 python3 scripts/bench_engines.py --device cuda
step whole_cuda 180 22 python3 scripts/bench_engines.py --whole-runs --device cuda --partitions dirichlet \
    --configs fedasync50 fedbuff50 fedavg50 fedasync10 fedavg10 --updates 300 --repeats 2
step ray_cpu8 200 12 python3 scripts/bench_parallel.py --workload heavy --workers 8 --versions 200 --repeats 1
step ray_cpu8_fedasmu 200 12 python3 scripts/bench_parallel.py --workload heavy-fedasmu --workers 8 --versions 200 \
    --repeats 1
step engines_cpu 40 9 python3 scripts/bench_engines.py
step ray_gpu 120 6 python3 scripts/bench_parallel.py --workload heavy --workers 4 --gpus-per-worker 0.25 \
    --versions 200 --repeats 1
