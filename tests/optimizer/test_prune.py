"""Pruning on the ONNX graph: channel groups followed through residuals, depthwise convs, Concat
and Flatten; weights in initializers or Constant nodes; magnitude and 2:4 zeroing; bad input."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ferry import zoo
from ferry.errors import InvalidInputError
from ferry.graph import constant, prepare
from ferry.optimizer.prune import channel_groups, check_2_4, macs, prune

RNG = np.random.default_rng(0)


@functools.cache
def _zoo(name: str) -> ir.Model:
    """A zoo model, built once for the module (pruning never changes the model it is given)."""
    return zoo.build(name)


def _run(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = model if isinstance(model, onnx.ModelProto) else ir.to_proto(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def _net(
    dead: tuple[int, ...] = (1, 3, 5, 7), bn_gamma: np.ndarray | None = None
) -> onnx.ModelProto:
    """Stem conv (8) -> BN -> Relu -> depthwise (8) -> Relu -> conv (8) -> Add(stem) ->
    Concat(branch conv (4)) -> conv (6) -> Relu -> Flatten (6*4*4) -> Gemm (3).

    The channels in ``dead`` are zero in every layer that makes them (stem, residual conv,
    depthwise bias, BN beta), so removing them changes nothing: a pruned model must compute the
    same outputs exactly.
    """
    w_stem = RNG.standard_normal((8, 3, 3, 3))
    w_dw = RNG.standard_normal((8, 1, 3, 3))
    b_dw = RNG.standard_normal(8)
    w_res = RNG.standard_normal((8, 8, 1, 1))
    b_res = RNG.standard_normal(8)
    w_branch = RNG.standard_normal((4, 3, 3, 3))
    w_mix = RNG.standard_normal((6, 12, 1, 1))
    gamma = RNG.uniform(0.5, 1.5, 8) if bn_gamma is None else bn_gamma
    beta = RNG.standard_normal(8)
    for c in dead:
        w_stem[c] = 0
        w_res[c] = 0
        b_res[c] = 0
        b_dw[c] = 0
        beta[c] = 0
    inits = [
        _init("w_stem", w_stem),
        _init("gamma", gamma),
        _init("beta", beta),
        _init("mean", np.zeros(8)),
        _init("var", np.ones(8)),
        _init("w_dw", w_dw),
        _init("b_dw", b_dw),
        _init("w_res", w_res),
        _init("b_res", b_res),
        _init("w_branch", w_branch),
        _init("w_mix", w_mix),
        _init("w_fc", RNG.standard_normal((3, 6 * 4 * 4))),
        _init("b_fc", RNG.standard_normal(3)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_stem"], ["stem"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["stem", "gamma", "beta", "mean", "var"], ["bn"], name="bn"
        ),
        helper.make_node("Relu", ["bn"], ["a"], name="relu_a"),
        helper.make_node(
            "Conv", ["a", "w_dw", "b_dw"], ["dw"], name="dw", group=8, pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["dw"], ["dw_r"], name="relu_dw"),
        helper.make_node("Conv", ["dw_r", "w_res", "b_res"], ["res"], name="res"),
        helper.make_node("Add", ["res", "a"], ["sum"], name="add"),
        helper.make_node("Conv", ["x", "w_branch"], ["branch"], name="branch", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["sum", "branch"], ["cat"], name="cat", axis=1),
        helper.make_node("Conv", ["cat", "w_mix"], ["mix"], name="mix"),
        helper.make_node("Relu", ["mix"], ["mix_r"], name="relu_mix"),
        helper.make_node(
            "MaxPool", ["mix_r"], ["pool"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("Flatten", ["pool"], ["flat"], name="flat", axis=1),
        helper.make_node("Gemm", ["flat", "w_fc", "b_fc"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _as_constants(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with every initializer a Constant node (as Paddle's exporter writes)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    constants = [
        helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t)
        for t in proto.graph.initializer
    ]
    del proto.graph.initializer[:]
    nodes = constants + list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return proto


def _feeds(batch: int = 2) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((batch, 3, 8, 8)).astype(np.float32)}


@pytest.mark.parametrize("optimize", [True, False])
def test_removing_dead_channels_changes_nothing(optimize: bool) -> None:
    proto = _net()
    # Only the stem + residual group has dead channels; the others keep theirs.
    result = prune(
        ir.from_proto(proto), sparsity=0.5, exclude=["mix", "branch"], optimize=optimize, multiple=1
    )
    feeds = _feeds()
    np.testing.assert_allclose(
        _run(result.model, feeds)[0], _run(proto, feeds)[0], rtol=1e-4, atol=1e-4
    )
    report = result.report
    # stem and res are one group (the residual Add); Concat and Flatten follow it.
    (group,) = report.groups
    assert sorted(group["nodes"]) == ["res", "stem"]
    assert group["channels"] == 8 and group["kept"] == 4 and group["removed"] == 4
    assert report.macs_after < report.macs_before
    assert report.after.params < report.before.params
    if not optimize:
        nodes = {n.name: n for n in result.model.graph}
        assert nodes["dw"].attributes.get_int("group") == 4
        assert constant(nodes["bn"].inputs[1]).shape == (4,)
        assert constant(nodes["mix"].inputs[1]).shape == (6, 8, 1, 1)
        assert constant(nodes["fc"].inputs[1]).shape == (3, 6 * 16)


def test_every_group_pruned_still_runs() -> None:
    proto = _net()
    result = prune(ir.from_proto(proto), sparsity=0.5, optimize=False, multiple=1)
    assert sorted(n for g in result.report.groups for n in g["nodes"]) == [
        "branch",
        "mix",
        "res",
        "stem",
    ]
    nodes = {n.name: n for n in result.model.graph}
    # Concat: 4 of stem+res, then 2 of branch; Flatten: 3 of mix's channels x 16 positions.
    assert constant(nodes["mix"].inputs[1]).shape == (3, 6, 1, 1)
    assert constant(nodes["fc"].inputs[1]).shape == (3, 3 * 16)
    assert _run(result.model, _feeds())[0].shape == (2, 3)


def test_constant_node_weights_prune_the_same() -> None:
    proto = _net()
    feeds = _feeds()
    for optimize in (False, True):
        plain = prune(
            ir.from_proto(proto), method="channel", sparsity=0.5, optimize=optimize, multiple=1
        )
        consts = prune(
            ir.from_proto(_as_constants(proto)),
            method="channel",
            sparsity=0.5,
            optimize=optimize,
            multiple=1,
        )
        assert consts.report.macs_after == plain.report.macs_after
        assert consts.report.after.params == plain.report.after.params
        np.testing.assert_allclose(
            _run(consts.model, feeds)[0], _run(plain.model, feeds)[0], rtol=1e-5
        )
    # Without optimization the weights stay in Constant nodes, pruned in place.
    kept = prune(
        ir.from_proto(_as_constants(proto)),
        method="channel",
        sparsity=0.5,
        optimize=False,
        multiple=1,
    )
    assert not kept.model.graph.initializers
    stem_w = next(n for n in kept.model.graph if n.name == "const_w_stem")
    assert stem_w.attributes["value"].as_tensor().shape.numpy() == (4, 3, 3, 3)


def test_bn_gamma_keeps_the_largest_scales() -> None:
    gamma = np.array([0.1, 5, 0.2, 4, 0.3, 3, 0.4, 2], dtype=np.float32)
    proto = _net(dead=(), bn_gamma=gamma)
    for optimize in (False, True):
        result = prune(
            ir.from_proto(proto), sparsity=0.5, criterion="bn-gamma", optimize=optimize, multiple=1
        )
        group = next(g for g in result.report.groups if "stem" in g["nodes"] or "res" in g["nodes"])
        assert group["criterion"] == "bn-gamma"
    plain = prune(
        ir.from_proto(proto), sparsity=0.5, criterion="bn-gamma", optimize=False, multiple=1
    )
    bn_node = next(n for n in plain.model.graph if n.name == "bn")
    np.testing.assert_array_equal(constant(bn_node.inputs[1]), [5, 4, 3, 2])


def test_zoo_cnns_prune_valid_and_faster() -> None:
    for name in ("digits_cnn", "mobilenet_v2"):
        model = _zoo(name)
        feeds = zoo.example_inputs(name, batch=2)
        want = _run(model, feeds)
        for sparsity in (0.3, 0.5):
            result = prune(model, method="channel", sparsity=sparsity, multiple=1)
            got = _run(result.model, feeds)
            assert [g.shape for g in got] == [w.shape for w in want]
            onnx.checker.check_model(ir.to_proto(result.model), full_check=True)
            ratio = result.report.macs_after / result.report.macs_before
            keep = 1 - sparsity
            # Layers lose output and input channels: (1-s)^2 of their MACs, (1-s) at the ends.
            assert keep**2 * 0.8 <= ratio <= keep * 1.05, (name, sparsity, ratio)
            assert result.report.groups
            # Counts rounded up to multiples of 8 (AVX2's channel block) cut less, never more.
            rounded = prune(model, method="channel", sparsity=sparsity, multiple=8).report
            assert ratio <= rounded.macs_after / rounded.macs_before < 1
    assert macs(model) == result.report.macs_before  # the model given is not changed


def test_residual_adds_are_one_group() -> None:
    model = _zoo("mobilenet_v2")
    result = prune(model, sparsity=0.5)
    for node in result.model.graph:
        if node.op_type == "Add":
            shapes = {
                tuple(v.shape)[1] for v in node.inputs if v is not None and v.shape is not None
            }
            assert len(shapes) == 1, node.name
    # The 16-channel block's residual couples 2 projections into one group.
    assert any(len(g["nodes"]) > 1 for g in result.report.groups)


def test_pinned_reshape_is_refused_naming_the_node() -> None:
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["y"], name="split_heads"),
    ]
    graph = helper.make_graph(
        nodes,
        "pinned",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 256])],
        [_init("w", w), numpy_helper.from_array(np.array([1, 2, 256], dtype=np.int64), "shape")],
    )
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    result = prune(model, sparsity=0.5)
    assert not result.report.groups
    (skipped,) = result.report.skipped
    assert skipped["name"] == "conv" and "split_heads" in skipped["reason"]
    assert "pins the channel count" in skipped["reason"]


def test_flatten_reshape_is_rewritten() -> None:
    model = _zoo("digits_cnn")  # Reshape [N, 32, 4, 4] -> [N, 512] before the Gemm
    result = prune(model, sparsity=0.5)
    gemm = next(n for n in result.model.graph if n.op_type == "Gemm")
    assert (
        constant(gemm.inputs[1]).shape[1 if gemm.attributes.get_int("transB", 0) else 0] == 16 * 16
    )


def test_exclude_keeps_the_node_channels() -> None:
    proto = _net()
    result = prune(ir.from_proto(proto), sparsity=0.5, exclude=["mix"], optimize=False, multiple=1)
    assert all("mix" not in g["nodes"] for g in result.report.groups)
    assert any(s["reason"] == "mix is excluded" for s in result.report.skipped)
    # Excluding a Conv whose BatchNorm optimization folds into it still works.
    folded = prune(ir.from_proto(proto), sparsity=0.5, exclude=["stem"], multiple=1)
    assert any("stem is excluded" in s["reason"] for s in folded.report.skipped)
    assert len(folded.report.groups) == 2
    with pytest.raises(InvalidInputError, match="'nope'.*does not have"):
        prune(ir.from_proto(proto), sparsity=0.5, exclude=["nope"], multiple=1)


def test_graph_output_groups_are_kept() -> None:
    result = prune(_zoo("mlp"), sparsity=0.5)
    assert any("graph output" in s["reason"] for s in result.report.skipped)
    assert result.report.groups  # the hidden layers are pruned


@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.9])
def test_magnitude_hits_the_sparsity(sparsity: float) -> None:
    model = _zoo("mobilenet_v2")
    result = prune(model, method="magnitude", sparsity=sparsity)
    report = result.report
    assert report.after.params == report.before.params and report.macs_after == report.macs_before
    assert "not faster" in report.note and "compressed" in report.note
    assert report.after.compressed_bytes < report.before.compressed_bytes
    # The stem (the first layer, a small share of the weights) stays dense; the rest hit it.
    (stem,) = report.skipped
    assert "the first layer" in stem["reason"]
    for node in result.model.graph:
        if node.op_type in ("Conv", "Gemm"):
            weight = constant(node.inputs[1])
            zeros = 1 - np.count_nonzero(weight) / weight.size
            want = 0.0 if node.name == stem["name"] else sparsity
            assert abs(zeros - want) <= 1 / weight.size + 1e-9, node.name
    # An MLP's first layer holds half its weights: zeroed like the rest.
    assert prune(_zoo("mlp"), method="magnitude", sparsity=sparsity).report.skipped == ()


def test_2_4_pattern_and_validator() -> None:
    model = _zoo("mobilenet_v2")
    assert check_2_4(model)  # dense weights break the pattern
    result = prune(model, method="2:4", sparsity=0.5)
    assert check_2_4(result.model) == []
    assert any("not a multiple of 4" in s["reason"] for s in result.report.skipped)
    assert any("grouped" in s["reason"] for s in result.report.skipped)
    # Break one weight: the validator names it.
    node = next(n for n in result.model.graph if n.name in result.report.layers)
    weight = constant(node.inputs[1]).copy()
    weight[0, :4] = 1.0
    node.inputs[1].const_value = ir.tensor(weight, name=node.inputs[1].name)
    (broken,) = check_2_4(result.model)
    assert node.inputs[1].name in broken and node.name in broken


def test_kept_counts_round_up_to_the_multiple() -> None:
    # digits_cnn: 16 and 32 channels; at 0.3, 11.2 -> 16 (nothing cut) and 22.4 -> 24.
    result = prune(_zoo("digits_cnn"), sparsity=0.3, multiple=8)
    assert [g["kept"] for g in result.report.groups] == [24]
    assert result.report.multiple == 8
    exact = prune(_zoo("digits_cnn"), sparsity=0.3, multiple=1)
    assert sorted(g["kept"] for g in exact.report.groups) == [12, 23]
    with pytest.raises(InvalidInputError, match="multiple must be a whole number"):
        prune(_zoo("digits_cnn"), sparsity=0.3, multiple=0)


def test_the_default_multiple_is_the_cpus_channel_block() -> None:
    from ferry.optimizer._host import channel_block

    assert channel_block({"sse2", "avx2", "avx512f"}) == 16  # NCHW16c kernels
    assert channel_block({"sse2", "avx2"}) == 8
    assert channel_block({"asimd"}) == 8
    assert prune(_zoo("digits_cnn"), sparsity=0.3).report.multiple == channel_block()


def test_macs_counts_layers() -> None:
    proto = _net()
    # stem 8*27*64 + dw 8*9*64 + res 8*8*64 + branch 4*27*64 + mix 6*12*64 + fc 3*96
    assert macs(ir.from_proto(proto)) == 64 * (8 * 27 + 8 * 9 + 64 + 4 * 27 + 6 * 12) + 3 * 96


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sparsity": 1.0}, "sparsity must be a number in \\[0, 1\\)"),
        ({"sparsity": -0.1}, "sparsity must be"),
        ({"sparsity": float("nan")}, "sparsity must be"),
        ({"sparsity": "0.5"}, "sparsity must be"),
        ({"sparsity": True}, "sparsity must be"),
        ({"method": "random"}, "unknown pruning method 'random'; use one of channel"),
        ({"criterion": "taylor"}, "unknown pruning criterion 'taylor'; use one of l1"),
        ({"method": "2:4", "sparsity": 0.3}, "2:4 pruning removes exactly half"),
        ({"exclude": "stem"}, "list of node names"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        prune(ir.from_proto(_net()), **{"sparsity": 0.5, **kwargs}, multiple=1)  # type: ignore[arg-type]


def test_groups_name_what_pins_them() -> None:
    groups = channel_groups(prepare(ir.from_proto(_net())))
    blocked = [g for g in groups if g.blocked and g.sources]
    assert [g.name for g in blocked] == ["fc"]
    assert "graph output 'y'" in blocked[0].blocked[0]


def _digits_feeds(count: int, start: int = 0) -> list[dict[str, np.ndarray]]:
    x_train = zoo.digits_data()[0]
    return [{"input": x_train[i : i + 1]} for i in range(start, start + count)]


def test_activation_criterion_needs_data() -> None:
    with pytest.raises(InvalidInputError, match="activation criterion.*give data"):
        prune(_zoo("digits_cnn"), sparsity=0.5, criterion="activation")


def test_data_recentres_the_next_layer_and_ranks_by_activation() -> None:
    # Unseen digits judge: the logits of the pruned model against the original's.
    model = _zoo("digits_cnn")
    judged = _digits_feeds(64, start=1000)
    want = np.concatenate([_run(model, f)[0] for f in judged])

    def error(pruned: ir.Model) -> float:
        got = np.concatenate([_run(pruned, f)[0] for f in judged])
        return float(np.abs(got - want).mean())

    data = _digits_feeds(64)
    plain = prune(model, sparsity=0.5, multiple=1)
    centred = prune(model, sparsity=0.5, multiple=1, data=data)
    ranked = prune(model, sparsity=0.5, multiple=1, data=data, criterion="activation")
    assert ranked.report.criterion == "activation"
    assert [g["criterion"] for g in ranked.report.groups] == ["activation"] * 2
    # Same channels removed, only the biases differ: the logits move less.
    assert error(centred.model) < error(plain.model)
    assert error(ranked.model) < error(plain.model)
    assert macs(ranked.model) == macs(plain.model)
