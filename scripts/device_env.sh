# Sourced by scripts/gpu_window.sh before any run, on the device machine:
# installs the carried wheels (.whl/, unless NO_WHL is set), sets JAX's environment, and
# fails the call at once if a package the runs import is missing or broken.
export PYTHONUNBUFFERED=1
if [ -z "${NO_WHL:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/xla_cache TF_CPP_MIN_LOG_LEVEL=2
# GEMM autotuning compiles dozens of kernel variants per shape: minutes per shape.
export XLA_FLAGS="${XLA_FLAGS:---xla_gpu_autotune_level=0 --xla_gpu_enable_triton_gemm=false}"
# flax.nnx too: `import flax` alone passed with a flax that fails on the device's JAX.
python3 -c "import jax, flax, flax.nnx, optax, orbax.checkpoint, sacrebleu, sacremoses, sentencepiece, ml_collections, tensorboardX; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'orbax', orbax.checkpoint.__version__, jax.devices())" || exit 1
if command -v nvidia-smi >/dev/null; then  # (a machine without it is no failure)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
