#!/usr/bin/env bash
# The accelerator checks, in one call of a lent GPU machine (see bench/README.md).
#
#   bash bench/on_accelerator.sh OUT_DIR
#
# The machine has JAX with CUDA but no package index: the project's other
# dependencies travel as wheels in .whl/ (made with `pip download`, see
# bench/README.md) and go into the machine's own Python, which has JAX. Each
# stage runs on its own, so one that fails leaves the others' figures:
#   1. versions and the device;
#   2. device_overlap: the whole iterator feeding a synthetic 4.1 ms step;
#   3. bench.peers target6 (our subjects only, no peers there): the whole
#      iterator with global arrays on the GPU against the host pipeline alone
#      and, at 1 worker, against its own worker pipeline read as numpy, at 0
#      and 1 worker, in paired windows of one process;
#   4. loop_wait: the reference training loop on configs/demo.py.
set -uo pipefail
out=${1:?usage: bench/on_accelerator.sh OUT_DIR}
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
tiny=${TINY:+--tiny}  # TINY=1: smoke sizes, to try this script on a CPU machine first
py=${XD_PYTHON:-}      # XD_PYTHON: an interpreter that already has the dependencies
if [ -z "$py" ]; then  # the machine's own Python with JAX (a bare machine: install into it)
  py=/opt/torch/.venv/bin/python3
  [ -x "$py" ] || py=$(command -v python3)
  "$py" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 1
fi

stage() {  # stage NAME COMMAND...: runs, logs to OUT/NAME.log, reports its time and status
  local name=$1 began=$SECONDS
  shift
  echo "== $name"
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "== $name: exit $rc after $((SECONDS - began)) s"
}

stage versions "$py" -c "
import jax, grain, numpy, flax, optax, orbax.checkpoint as ocp, sys
print(sys.version.split()[0], 'jax', jax.__version__, 'numpy', numpy.__version__,
      'flax', flax.__version__, 'optax', optax.__version__, 'orbax', ocp.__version__)
print(jax.devices(), jax.devices()[0].device_kind)
import os; print('cpus', os.cpu_count())"
"$py" -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|flax|optax|orbax|grain|numpy|jax-cuda)" >>"$out/versions.log"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv >>"$out/versions.log" 2>&1
stage device_overlap "$py" -m bench.run device_overlap $tiny --out "$out"
stage peers_target6 timeout 300 "$py" -m bench.peers $tiny --groups target6 --rounds "${ROUNDS:-3}" --out "$out"
stage loop_wait timeout 240 "$py" -m bench.run loop_wait $tiny --out "$out"
