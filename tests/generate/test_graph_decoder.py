"""The decoder graph against a numpy reference forward, on tiny random configs of each family."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from ferry.generate._config import DecoderConfig
from ferry.generate._graph import build_decoder

# -- a tiny stand-in for DecoderWeights -------------------------------------------------------


@dataclasses.dataclass
class Blocks:
    bits: int
    values: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    mins: np.ndarray | None


class FakeWeight:
    def __init__(self, array: np.ndarray, blocks: Blocks | None = None) -> None:
        self.array = array.astype(np.float32)
        self._blocks = blocks

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def float(self) -> np.ndarray:
        return self.array

    def blocks(self) -> Blocks | None:
        return self._blocks


class FakeWeights(dict):
    pass


def make_config(**kw: Any) -> DecoderConfig:
    base: dict[str, Any] = dict(
        architecture="llama",
        vocab_size=96,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )
    base.update(kw)
    return DecoderConfig(**base)


def make_weights(cfg: DecoderConfig, seed: int = 0) -> FakeWeights:
    rng = np.random.default_rng(seed)
    h, d, nh, kv, f = (
        cfg.hidden_size,
        cfg.head_dim,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.intermediate_size,
    )
    gemma = cfg.norm_plus_one

    def mat(o: int, i: int) -> FakeWeight:
        return FakeWeight(rng.normal(0, 1 / math.sqrt(i), (o, i)))

    def norm(n: int) -> FakeWeight:
        base = 0.0 if gemma else 1.0
        return FakeWeight(base + rng.normal(0, 0.1, n))

    w = FakeWeights()
    w["embed"] = FakeWeight(rng.normal(0, 1, (cfg.vocab_size, h)))
    w["final_norm"] = norm(h)
    if not cfg.tie_word_embeddings:
        w["lm_head"] = mat(cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = norm(h)
        w[p + "q"], w[p + "k"], w[p + "v"] = mat(nh * d, h), mat(kv * d, h), mat(kv * d, h)
        w[p + "o"] = mat(h, nh * d)
        if cfg.attention_bias:
            for name, n in (("q", nh * d), ("k", kv * d), ("v", kv * d)):
                w[p + name + "_bias"] = FakeWeight(rng.normal(0, 0.5, n))
        if cfg.qk_norm:
            w[p + "q_norm"], w[p + "k_norm"] = norm(d), norm(d)
        if gemma:
            w[p + "post_attn_norm"], w[p + "post_ffn_norm"] = norm(h), norm(h)
        w[p + "ffn_norm"] = norm(h)
        w[p + "gate"], w[p + "up"], w[p + "down"] = mat(f, h), mat(f, h), mat(h, f)
    return w


CONFIGS = {
    "llama_gqa": make_config(),
    "llama_interleaved": make_config(rope_interleaved=True, num_kv_heads=1),
    "llama3_scaled": make_config(
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16}
    ),
    "qwen2_bias": make_config(architecture="qwen2", attention_bias=True, tie_word_embeddings=True),
    "qwen3_qknorm": make_config(architecture="qwen3", qk_norm=True, head_dim=32, rope_theta=1e6),
    "gemma2": make_config(
        architecture="gemma2",
        norm_plus_one=True,
        activation="gelu_tanh",
        embedding_scale=8.0,
        sliding_window=3,
        sliding_pattern=(True, False),
        attn_softcap=5.0,
        final_softcap=3.0,
        query_scale=0.2,
        tie_word_embeddings=True,
        head_dim=32,
    ),
    "gemma3": make_config(
        architecture="gemma3",
        norm_plus_one=True,
        qk_norm=True,
        activation="gelu_tanh",
        embedding_scale=8.0,
        sliding_window=4,
        sliding_pattern=(True, False),
        rope_theta=1e6,
        rope_local_theta=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        tie_word_embeddings=True,
    ),
}

# -- the numpy reference --------------------------------------------------------------------


def _rms(x: np.ndarray, w: np.ndarray, cfg: DecoderConfig) -> np.ndarray:
    w = w + 1.0 if cfg.norm_plus_one else w
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_norm_eps) * w


def _inv_freq(cfg: DecoderConfig, local: bool) -> np.ndarray:
    """theta^(-2i/d); the scaled forms come from the graph's own helper (checked elsewhere)."""
    if local:
        theta = cfg.rope_local_theta or cfg.rope_theta
        return 1.0 / theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    from ferry.generate._graph_attention import inv_freq

    return inv_freq(cfg).astype(np.float64)


def _rope(x: np.ndarray, pos: np.ndarray, cfg: DecoderConfig, local: bool = False) -> np.ndarray:
    """x [h, S, d] rotated at positions pos [S]."""
    ang = pos[:, None].astype(np.float64) * _inv_freq(cfg, local)[None, :]  # [S, d/2]
    cos, sin = np.cos(ang), np.sin(ang)
    out = np.empty_like(x)
    if cfg.rope_interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
    else:
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        out[..., :half] = a * cos - b * sin
        out[..., half:] = b * cos + a * sin
    return out


def reference(cfg: DecoderConfig, w: FakeWeights, ids: np.ndarray) -> np.ndarray:
    """Logits [S, vocab] of one unpadded sequence, float64."""
    f = {k: v.float().astype(np.float64) for k, v in w.items()}
    s, d, nh, kv = len(ids), cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    pos = np.arange(s)
    x = f["embed"][ids] * cfg.embedding_scale
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        y = _rms(x, f[p + "attn_norm"], cfg)
        q, k, v = y @ f[p + "q"].T, y @ f[p + "k"].T, y @ f[p + "v"].T
        if cfg.attention_bias:
            q, k, v = q + f[p + "q_bias"], k + f[p + "k_bias"], v + f[p + "v_bias"]
        q = q.reshape(s, nh, d)
        k = k.reshape(s, kv, d)
        v = v.reshape(s, kv, d).transpose(1, 0, 2)
        if cfg.qk_norm:
            q, k = _rms(q, f[p + "q_norm"], cfg), _rms(k, f[p + "k_norm"], cfg)
        local = bool(cfg.sliding_pattern and cfg.sliding_pattern[i] and cfg.rope_local_theta)
        q = _rope(q.transpose(1, 0, 2), pos, cfg, local)
        k = _rope(k.transpose(1, 0, 2), pos, cfg, local)
        k, v = np.repeat(k, nh // kv, axis=0), np.repeat(v, nh // kv, axis=0)
        scores = q @ k.transpose(0, 2, 1) * cfg.query_scale
        if cfg.attn_softcap:
            scores = np.tanh(scores / cfg.attn_softcap) * cfg.attn_softcap
        allowed = pos[None, :] <= pos[:, None]
        if cfg.sliding_pattern and cfg.sliding_pattern[i]:
            allowed &= pos[:, None] - pos[None, :] < cfg.sliding_window
        scores = np.where(allowed, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(s, nh * d)
        out = ctx @ f[p + "o"].T
        if p + "post_attn_norm" in f:
            out = _rms(out, f[p + "post_attn_norm"], cfg)
        x = x + out
        y = _rms(x, f[p + "ffn_norm"], cfg)
        g, u = y @ f[p + "gate"].T, y @ f[p + "up"].T
        if cfg.activation == "silu":
            a = g / (1 + np.exp(-g))
        else:
            a = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
        out = (a * u) @ f[p + "down"].T
        if p + "post_ffn_norm" in f:
            out = _rms(out, f[p + "post_ffn_norm"], cfg)
        x = x + out
    x = _rms(x, f["final_norm"], cfg)
    logits = x @ f.get("lm_head", f["embed"]).T
    if cfg.final_softcap:
        logits = np.tanh(logits / cfg.final_softcap) * cfg.final_softcap
    return logits


# -- running the graph ----------------------------------------------------------------------


def to_bytes(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString()


class Runner:
    def __init__(self, model: ir.Model, cfg: DecoderConfig) -> None:
        self.cfg = cfg
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        # onnxruntime rewrites a standard DequantizeLinear -> MatMul into MatMulNBits with int8
        # activations unless told to keep float ones: the tests compare exact values.
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
        self.sess = ort.InferenceSession(to_bytes(model), opts, providers=["CPUExecutionProvider"])

    def empty_past(self, batch: int) -> list[np.ndarray]:
        shape = (batch, self.cfg.num_kv_heads, 0, self.cfg.head_dim)
        return [np.zeros(shape, np.float32)] * (2 * self.cfg.num_layers)

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        feeds: dict[str, np.ndarray] = {
            "input_ids": ids.astype(np.int64),
            "attention_mask": mask.astype(np.int64),
            "position_ids": pos.astype(np.int64),
        }
        for i in range(self.cfg.num_layers):
            feeds[f"past_key_values.{i}.key"] = past[2 * i]
            feeds[f"past_key_values.{i}.value"] = past[2 * i + 1]
        out = self.sess.run(None, feeds)
        return out[0], out[1:]

    def prompt(self, ids: np.ndarray) -> np.ndarray:
        n = len(ids)
        return self(ids[None], np.ones((1, n)), np.arange(n)[None], self.empty_past(1))[0][0]


IDS = np.array([3, 17, 42, 5, 88, 1, 64, 9, 30, 2], dtype=np.int64)


@pytest.fixture(
    scope="module",
    params=[(name, flavour) for name in sorted(CONFIGS) for flavour in ("standard", "ort")],
    ids=lambda param: "-".join(param),
)
def case(request: pytest.FixtureRequest) -> tuple[DecoderConfig, FakeWeights, ir.Model]:
    name, flavour = request.param
    cfg = CONFIGS[name]
    weights = make_weights(cfg)
    return cfg, weights, build_decoder(cfg, weights, flavour=flavour)


def test_prompt_logits_match_reference(case: Any) -> None:
    cfg, weights, model = case
    got = Runner(model, cfg).prompt(IDS)
    want = reference(cfg, weights, IDS)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_token_steps_through_past_match_prompt(case: Any) -> None:
    cfg, _, model = case
    run = Runner(model, cfg)
    full = run.prompt(IDS)
    n = 4
    logits, past = run(IDS[None, :n], np.ones((1, n)), np.arange(n)[None], run.empty_past(1))
    steps = [logits[0]]
    for t in range(n, len(IDS)):
        logits, past = run(IDS[None, t : t + 1], np.ones((1, t + 1)), np.array([[t]]), past)
        steps.append(logits[0])
        assert past[0].shape == (1, cfg.num_kv_heads, t + 1, cfg.head_dim)
    np.testing.assert_allclose(np.concatenate(steps), full, rtol=1e-4, atol=1e-4)


def test_chunks_through_past_match_prompt(case: Any) -> None:
    """Several new tokens on top of a past (chunked prefill) mask causally by slot."""
    cfg, _, model = case
    run = Runner(model, cfg)
    full = run.prompt(IDS)
    logits, past = run(IDS[None, :4], np.ones((1, 4)), np.arange(4)[None], run.empty_past(1))
    chunks = [logits[0]]
    for start, stop in ((4, 7), (7, len(IDS))):
        logits, past = run(
            IDS[None, start:stop], np.ones((1, stop)), np.arange(start, stop)[None], past
        )
        chunks.append(logits[0])
    np.testing.assert_allclose(np.concatenate(chunks), full, rtol=1e-4, atol=1e-4)


def test_left_padded_batch_matches_rows_alone(case: Any) -> None:
    cfg, _, model = case
    run = Runner(model, cfg)
    short = IDS[:6]
    pad = len(IDS) - len(short)
    ids = np.stack([IDS, np.concatenate([np.zeros(pad, np.int64), short])])
    mask = np.stack([np.ones(len(IDS)), np.concatenate([np.zeros(pad), np.ones(len(short))])])
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    logits, past = run(ids, mask, pos, run.empty_past(2))
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(logits[0], run.prompt(IDS), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits[1, pad:], run.prompt(short), rtol=1e-4, atol=1e-4)
    # one more token for both rows, through the padded cache
    nxt = np.array([[7], [7]])
    mask2 = np.concatenate([mask, np.ones((2, 1))], axis=1)
    pos2 = pos[:, -1:] + 1
    step, _ = run(nxt, mask2, pos2, past)
    np.testing.assert_allclose(step[0, 0], run.prompt(np.append(IDS, 7))[-1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        step[1, 0], run.prompt(np.append(short, 7))[-1], rtol=1e-4, atol=1e-4
    )


def test_model_passes_checker_and_says_what_it_is(case: Any) -> None:
    cfg, _, model = case
    proto = ir.serde.serialize_model(model)
    onnx.checker.check_model(proto, full_check=True)
    names = [i.name for i in proto.graph.input]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert names[3:5] == ["past_key_values.0.key", "past_key_values.0.value"]
    outs = [o.name for o in proto.graph.output]
    assert outs[:3] == ["logits", "present.0.key", "present.0.value"]
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["ferry.generative"] == "decoder"
    assert DecoderConfig.from_dict(__import__("json").loads(props["ferry.decoder_config"])) == cfg
    fused = {"RotaryEmbedding", "SkipSimplifiedLayerNormalization", "GroupQueryAttention"}
    op_types = {node.op_type for node in proto.graph.node}
    if props["ferry.flavour"] != "ort":
        assert not fused & op_types
        return
    assert {"SkipSimplifiedLayerNormalization", "GroupQueryAttention"} <= op_types
    # q, k, v packed and rotated inside GroupQueryAttention unless a per-head norm sits between
    # the projection and the rotation (qwen3, gemma3): then RotaryEmbedding nodes rotate them.
    attention = [n for n in proto.graph.node if n.op_type == "GroupQueryAttention"]
    inside = {a.i for n in attention for a in n.attribute if a.name == "do_rotary"} == {1}
    assert inside == (not cfg.qk_norm and cfg.head_dim % 16 == 0)
    assert ("RotaryEmbedding" in op_types) == (not inside)


@pytest.mark.parametrize("name", ["llama_gqa", "gemma2"])
def test_runs_on_openvino(name: str, tmp_path: Any) -> None:
    ov = pytest.importorskip("openvino")
    cfg = CONFIGS[name]
    weights = make_weights(cfg)
    model = build_decoder(cfg, weights)
    path = tmp_path / "decoder.onnx"
    path.write_bytes(to_bytes(model))
    # f32: a CPU with bf16 units would otherwise compute in bf16 by default.
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    n = len(IDS)
    feeds: dict[str, np.ndarray] = {
        "input_ids": IDS[None],
        "attention_mask": np.ones((1, n), np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
    }
    for i in range(cfg.num_layers):
        for part in ("key", "value"):
            feeds[f"past_key_values.{i}.{part}"] = np.zeros(
                (1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32
            )
    got = compiled(feeds)[compiled.output("logits")][0]
    np.testing.assert_allclose(got, reference(cfg, weights, IDS), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["linear", "llama3"])
def test_rope_scaling_matches_transformers(kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ferry.generate._graph_attention import inv_freq

    params = {"rope_type": kind, "factor": 8.0}
    if kind == "llama3":
        params.update(
            low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16
        )
    hf = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, rope_parameters={"rope_theta": 10000.0, **params}
    )
    want, _ = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
    got = inv_freq(make_config(rope_scaling=params))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
