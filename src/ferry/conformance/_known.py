"""Node test cases an engine is known to fail while its rules claim the op: engine bugs and
tolerances the engine cannot meet, each with its reason and, where there is one, the engine's own
record. A rule that over-claims or an adapter that mishandles a dtype is fixed instead, never
listed here. The kit's node check passes a backend whose only claimed failures are these, naming
them; ``tests/conformance`` fails its full run on an entry that matches no failing case any more.
"""

from __future__ import annotations

import functools
import locale
import re

__all__ = ["KNOWN_FAILURES", "known_failure", "known_failures"]

#: ``{backend: {case-name regex: reason}}``.
KNOWN_FAILURES: dict[str, dict[str, str]] = {
    "onnxruntime": {
        # ONNX Runtime skips these in its own run of ONNX's backend tests ("result mismatch"):
        # https://github.com/microsoft/onnxruntime/blob/main/onnxruntime/test/testdata/onnx_backend_test_series_filters.jsonc
        r"test_maxunpool_export_with_output_shape": "ORT MaxUnpool with output_shape mismatches",
        r"test_resize_downsample_scales_(cubic|linear)_align_corners": (
            "ORT Resize downsampling with align_corners mismatches (same ORT filter list)"
        ),
        # float32 FFT rounding: |err| up to 3e-4 where ONNX expects exact zeros with atol 1e-7;
        # ONNX Runtime's own run raises DFT's atol to 1e-4 (onnx_backend_test_series_overrides.jsonc).
        r"test_(dft|stft)\w*": "float32 FFT rounding, far below ONNX's atol of 1e-7",
        # ORT 1.32's Attention kernel (opset 23+): masks with -FLT_MAX where ONNX writes -inf into
        # qk_matmul_output; rejects a 4-D mask over padded past KV ("inconsistent
        # total_sequence_length"); one fp16 element 2 ULPs off.
        r"test_attention_4d_with_past_and_present_qk_matmul_bias_[34]d_mask_causal": (
            "ORT Attention writes -FLT_MAX, not -inf, for masked qk_matmul_output entries"
        ),
        r"test_attention_4d_diff_heads_mask4d_padded_kv": (
            "ORT Attention rejects a 4-D mask over padded past key/value"
        ),
        r"test_attention_4d_causal_fp16": "ORT Attention fp16: one element 2 ULPs off",
        # Data-dependent: ORT refuses ReduceMax over an empty set of bools; no rule can see that.
        r"test_reduce_max_empty_set_bool": "ORT ReduceMax: empty set with bool type undefined",
    },
}


@functools.lru_cache(maxsize=1)
def _has_locale(name: str) -> bool:
    current = locale.setlocale(locale.LC_ALL)
    try:
        locale.setlocale(locale.LC_ALL, name)
    except locale.Error:
        return False
    finally:
        locale.setlocale(locale.LC_ALL, current)
    return True


def known_failures(backend: str) -> dict[str, str]:
    """``backend``'s known failing cases on this machine: ``{case-name regex: reason}``."""
    known = dict(KNOWN_FAILURES.get(backend, {}))
    if backend == "onnxruntime" and not _has_locale("en_US.UTF-8"):
        # ORT's StringNormalizer builds an en_US.UTF-8 locale at session creation; it needs the
        # OS locale installed (locales-all on Debian). Nothing to do with the rules.
        known[r"test_strnormalizer_\w+"] = (
            "the en_US.UTF-8 locale ORT's StringNormalizer needs is not installed here"
        )
    return known


def known_failure(backend: str, case_name: str) -> str | None:
    """Why ``case_name`` is a known failure of ``backend``, or None when it is not one."""
    for pattern, reason in known_failures(backend).items():
        if re.fullmatch(pattern, case_name):
            return reason
    return None
