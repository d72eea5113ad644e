#!/usr/bin/env bash
# Prove `advisor calibrate --launch` on the H200 machine (issue 4, "On the GPU"), with vLLM 0.26.0
# as ../shared/GPU.md §A describes: dummy weights, synthetic acceptance, real engine timing.
#
# Run from the project root on the H200 machine, after install-vllm.sh, with:
#   .whl/        duckdb, zstandard, python-multipart, typer wheels for cp312 (the image lacks them)
#   .gpu-proof/  tokenizer.json + tokenizer_config.json of SmolLM2 (the converted CPU test model),
#                and conv.csv of the Azure 2023 trace (../shared does not travel to that machine)
# Output (under $OUT): the run's log, the stored calibration as JSON, and the recommendation that
# uses it.
#
# Models: Llama-3.1-8B's shapes with an EAGLE-3 head (bench/h200_sweep.py writes the configs), but
# with SmolLM2's vocabulary (49152 instead of 128256) so that the servers have a real tokenizer and
# take the text prompts the replay sends; the LM head is ~4% of the 8B's weights smaller than real.
set -euo pipefail
export PYTHONPATH=/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
models=/root/models
python3 - "$models" <<'PY'
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, "bench")
import h200_sweep

dirs = h200_sweep.write_models(Path(sys.argv[1]))
for name in ("llama-3.1-8b", "eagle3-llama-3.1-8b"):
    cfg = Path(dirs[name]) / "config.json"
    conf = json.loads(cfg.read_text())
    conf["vocab_size"] = 49152
    cfg.write_text(json.dumps(conf, indent=1))
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(Path(".gpu-proof") / f, Path(dirs["llama-3.1-8b"]) / f)
print("models:", dirs["llama-3.1-8b"], dirs["eagle3-llama-3.1-8b"])
PY
db=/root/calibrate.duckdb
rm -f "$db"
python3 -m cli ingest .gpu-proof/conv.csv --db "$db"
alpha='[0.8, 0.64, 0.512]'
set -x
python3 -m cli calibrate --launch --db "$db" \
    --target "$models/llama-3.1-8b" --method eagle3 --draft "$models/eagle3-llama-3.1-8b" --k 3 \
    --speculative-config "{\"rejection_sample_method\": \"synthetic\", \"synthetic_acceptance_rates\": $alpha}" \
    --gpu h200 --gpu-memory-utilization 0.42 --startup-timeout 300 \
    --max-requests 24 --max-minutes 0.5 --time-limit 3 --max-concurrency 16 \
    --log-dir "$OUT/logs" --notes "H200 launch proof: dummy weights, synthetic per-token acceptance 0.8" \
    -- --load-format dummy --max-model-len 4096 --no-enable-prefix-caching \
    --compilation-config '{"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}'
set +x
python3 -m cli calibrations list --db "$db"
python3 -m cli calibrations show latest --db "$db" --format json > "$OUT/calibration.json"
python3 -m cli recommend --db "$db" --calibration latest --format markdown \
    > "$OUT/recommendation.md" || echo "recommend refused the calibration (see above)"
