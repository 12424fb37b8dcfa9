"""The segment probe file (§7.2) and network (§4.7): validation, binding, numerics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pflash.compress.plan.segments import smooth_boundary_logits
from pflash.compress.scoring import ScoreResult
from pflash.errors import CompressionFailed, ModelUnavailable
from pflash.models.gguf_io import read_ggml_shapes
from pflash.models.probe import (
    NS,
    SUBUNIT_TENSORS,
    UNIT_TENSORS,
    ProbeFile,
    ProbeIdentity,
    ProbeNet,
    load_segment_probe,
    probe_fields,
    probe_tensors,
    read_probe_gguf,
    write_gguf,
    write_probe_gguf,
)

torch.set_num_threads(1)

N_EMBD, WIDTH, TAPS = 12, 7, 5
SHA = "3f" * 32
IDENTITY = ProbeIdentity(
    "smollm2_135m", "smollm2-135M", "post_block16_residual_before_block17", SHA, N_EMBD
)


def random_net(seed: int = 0, *, subunit: bool = True) -> ProbeNet:
    torch.manual_seed(seed)
    net = ProbeNet(N_EMBD, WIDTH, TAPS, subunit=subunit)
    with torch.no_grad():  # non-trivial norm and conv so parity tests see every term
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return net.eval()


def probe_file(net: ProbeNet | None = None, **meta) -> ProbeFile:
    net = net or random_net()
    fields = dict(
        schema=IDENTITY.schema(subunit=net.subunit_fc2 is not None),
        base_model=IDENTITY.base_model,
        runtime_gguf_sha256=SHA,
        feature_tap=IDENTITY.feature_tap,
        threshold=0.9,
        norm_eps=1e-5,
        min_segment=1,
        max_segment=2048,
        conv_taps=TAPS,
        tensors=net.tensors(),
    )
    return ProbeFile(**(fields | meta))


def write_raw(path, *, drop=(), set_fields=None, drop_tensors=(), set_tensors=None):
    """A probe file with keys/tensors removed or replaced: how a broken file looks."""
    fields = probe_fields(probe_file())
    tensors = probe_tensors(probe_file())
    for k in drop:
        del fields[k]
    fields.update(set_fields or {})
    for k in drop_tensors:
        del tensors[k]
    tensors.update(set_tensors or {})
    return write_gguf(path, fields, tensors)


def refused(path) -> str:
    with pytest.raises(ModelUnavailable) as err:
        read_probe_gguf(path)
    return str(err.value)


# --------------------------------------------------------------------------- format


def test_probe_file_round_trips_with_reference_ggml_shapes(tmp_path):
    f = probe_file()
    back = read_probe_gguf(write_probe_gguf(tmp_path / "p.gguf", f))
    assert (back.schema, back.base_model, back.runtime_gguf_sha256, back.feature_tap) == (
        "smollm2_135m_segment_probe_v2",
        "smollm2-135M",
        SHA,
        "post_block16_residual_before_block17",
    )
    assert (back.min_segment, back.max_segment, back.conv_taps) == (1, 2048, 5)
    assert back.threshold == pytest.approx(0.9) and back.norm_eps == pytest.approx(1e-5)
    for name, array in f.tensors.items():
        np.testing.assert_array_equal(back.tensors[name], array)
    shapes = read_ggml_shapes(tmp_path / "p.gguf")
    assert shapes[f"{NS}.fc1.weight"] == (N_EMBD, WIDTH)  # ggml order: [n_embd, width]
    assert shapes[f"{NS}.fc2.weight"] == (WIDTH,)  # 1-D: ggml drops the unit dimension
    assert shapes[f"{NS}.conv.weight"] == (TAPS,)
    assert shapes[f"{NS}.subunit.conv.bias"] == (1,)


def test_probe_without_subunit_head_round_trips_as_v1(tmp_path):
    f = probe_file(random_net(subunit=False))
    back = read_probe_gguf(write_probe_gguf(tmp_path / "p.gguf", f))
    assert back.schema == "smollm2_135m_segment_probe_v1" and not back.has_subunit


@pytest.mark.parametrize("key", list(probe_fields(probe_file())))
def test_loader_names_every_missing_metadata_key(tmp_path, key):
    message = refused(write_raw(tmp_path / "p.gguf", drop=[key]))
    assert f"lacks metadata key {key}" in message


WRONG_TYPES = [
    ("general.architecture", (7, "UINT32"), "must be STRING, got UINT32"),
    (f"{NS}.schema", (1.0, "FLOAT32"), "must be STRING, got FLOAT32"),
    (f"{NS}.base_model", (3, "INT32"), "must be STRING, got INT32"),
    (f"{NS}.runtime_gguf_sha256", (1, "UINT64"), "must be STRING, got UINT64"),
    (f"{NS}.feature_tap", (True, "BOOL"), "must be STRING, got BOOL"),
    (f"{NS}.threshold", ("0.9", "STRING"), "must be FLOAT32, got STRING"),
    (f"{NS}.threshold", (0.9, "FLOAT64"), "must be FLOAT32, got FLOAT64"),
    (f"{NS}.norm_eps", (1, "UINT32"), "must be FLOAT32, got UINT32"),
    (f"{NS}.min_segment", (1, "INT32"), "must be UINT32, got INT32"),
    (f"{NS}.max_segment", (2048.0, "FLOAT32"), "must be UINT32, got FLOAT32"),
    (f"{NS}.conv_taps", (5, "UINT64"), "must be UINT32, got UINT64"),
]


@pytest.mark.parametrize("key, value, expected", WRONG_TYPES)
def test_loader_names_a_key_of_the_wrong_type(tmp_path, key, value, expected):
    message = refused(write_raw(tmp_path / "p.gguf", set_fields={key: value}))
    assert f"{key} {expected}" in message


OUT_OF_RANGE = [
    ("general.architecture", ("llama", "STRING"), "general.architecture is 'llama'"),
    (f"{NS}.schema", ("smollm2_135m_scoring_head", "STRING"), "not a segment probe schema"),
    (f"{NS}.runtime_gguf_sha256", ("ABC", "STRING"), "is not a lowercase hex sha256"),
    (f"{NS}.threshold", (0.0, "FLOAT32"), "threshold 0.0 is not in (0, 1)"),
    (f"{NS}.threshold", (1.0, "FLOAT32"), "threshold 1.0 is not in (0, 1)"),
    (f"{NS}.threshold", (-0.5, "FLOAT32"), "threshold -0.5 is not in (0, 1)"),
    (f"{NS}.threshold", (math.nan, "FLOAT32"), "threshold nan is not in (0, 1)"),
    (f"{NS}.norm_eps", (0.0, "FLOAT32"), "norm_eps 0.0 is not in (0, 1)"),
    (f"{NS}.norm_eps", (math.inf, "FLOAT32"), "norm_eps inf is not in (0, 1)"),
    (f"{NS}.min_segment", (0, "UINT32"), "min_segment 0 is < 1"),
    (f"{NS}.max_segment", (0, "UINT32"), "max_segment 0 is below min_segment 1"),
    (f"{NS}.conv_taps", (4, "UINT32"), "conv_taps 4 is not a positive odd number"),
    (f"{NS}.conv_taps", (3, "UINT32"), "conv.weight has ggml shape [5], expected [3]"),
]


@pytest.mark.parametrize("key, value, expected", OUT_OF_RANGE)
def test_loader_names_an_out_of_range_value(tmp_path, key, value, expected):
    message = refused(write_raw(tmp_path / "p.gguf", set_fields={key: value}))
    assert expected in message


@pytest.mark.parametrize("name", UNIT_TENSORS)
def test_loader_names_every_missing_tensor(tmp_path, name):
    message = refused(write_raw(tmp_path / "p.gguf", drop_tensors=[f"{NS}.{name}"]))
    assert f"lacks tensor {NS}.{name}" in message


@pytest.mark.parametrize("name", SUBUNIT_TENSORS)
def test_subunit_head_needs_all_four_tensors(tmp_path, name):
    message = refused(write_raw(tmp_path / "p.gguf", drop_tensors=[f"{NS}.{name}"]))
    assert f"all four tensors or none; missing {NS}.{name}" in message


BAD_TENSORS = [
    ("norm.bias", np.zeros(N_EMBD + 1, np.float32), "norm.bias has ggml shape [13], expected [12]"),
    ("fc1.bias", np.zeros(WIDTH + 2, np.float32), "fc1.bias has ggml shape [9], expected [7]"),
    (
        "fc2.weight",
        np.zeros((1, WIDTH), np.float32),
        "fc2.weight has ggml shape [7, 1], expected [7]",
    ),
    ("fc2.bias", np.zeros(2, np.float32), "fc2.bias has ggml shape [2], expected [1]"),
    ("subunit.conv.weight", np.zeros(3, np.float32), "subunit.conv.weight has ggml shape [3]"),
    ("fc1.weight", np.zeros(N_EMBD, np.float32), "fc1.weight [n_embd, width]"),
    ("conv.weight", np.zeros(TAPS, np.float16), "conv.weight must be F32, got F16"),
    ("fc1.bias", np.full(WIDTH, np.nan, np.float32), "fc1.bias has non-finite values"),
]


@pytest.mark.parametrize("name, array, expected", BAD_TENSORS)
def test_loader_names_a_bad_tensor(tmp_path, name, array, expected):
    message = refused(write_raw(tmp_path / "p.gguf", set_tensors={f"{NS}.{name}": array}))
    assert expected in message


def test_loader_refuses_a_missing_or_unreadable_file(tmp_path):
    assert "not found" in refused(tmp_path / "absent.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    assert "not a readable GGUF file" in refused(tmp_path / "junk.gguf")


# --------------------------------------------------------------------------- binding


def test_probe_binds_to_the_drafter_it_was_trained_for(tmp_path):
    probe = load_segment_probe(write_probe_gguf(tmp_path / "p.gguf", probe_file()), IDENTITY)
    assert probe.params.threshold == pytest.approx(0.9)
    assert (probe.params.min_segment, probe.params.max_segment) == (1, 2048)
    assert probe.identity == IDENTITY


BINDING = [
    ("runtime_gguf_sha256", "ab" * 32, "trained for a different drafter file"),
    (
        "base_model",
        "Qwen/Qwen3.5-0.8B",
        "base_model is 'Qwen/Qwen3.5-0.8B', expected 'smollm2-135M'",
    ),
    ("feature_tap", "post_block14_residual_before_block15", "feature_tap is 'post_block14"),
    ("schema", "qwen3_5_0_8b_segment_probe_v2", "schema is 'qwen3_5_0_8b_segment_probe_v2'"),
]


@pytest.mark.parametrize("key, value, expected", BINDING)
def test_probe_for_another_drafter_is_refused(tmp_path, key, value, expected):
    path = write_probe_gguf(tmp_path / "p.gguf", probe_file(**{key: value}))
    with pytest.raises(ModelUnavailable) as err:
        load_segment_probe(path, IDENTITY)
    assert "does not fit this drafter" in str(err.value) and expected in str(err.value)


def test_probe_for_another_tap_width_is_refused(tmp_path):
    path = write_probe_gguf(tmp_path / "p.gguf", probe_file())
    wider = ProbeIdentity(**{**IDENTITY.__dict__, "n_embd": 576})
    with pytest.raises(ModelUnavailable, match="12 features, the drafter's tap has 576"):
        load_segment_probe(path, wider)


# --------------------------------------------------------------------------- numerics


def numpy_probe(f: ProbeFile, x: np.ndarray, prefix: str = "") -> np.ndarray:
    """§4.7 step 1-2 written out in float64 numpy: LayerNorm with bias, fc1, tanh GELU,
    fc2, then the CPU smoothing of pflash.segments. x [S, n_embd] -> probabilities [S]."""
    t = {k: v.astype(np.float64) for k, v in f.tensors.items()}
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    h = (x - mu) / np.sqrt(var + f.norm_eps) * t["norm.weight"] + t["norm.bias"]
    h = h @ t["fc1.weight"].T + t["fc1.bias"]
    h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    raw = h @ t[f"{prefix}fc2.weight"] + t[f"{prefix}fc2.bias"][0]
    return smooth_boundary_logits(raw, t[f"{prefix}conv.weight"], t[f"{prefix}conv.bias"][0])


def test_torch_probe_equals_the_numpy_reference_for_unit_and_subunit(tmp_path):
    f = read_probe_gguf(write_probe_gguf(tmp_path / "p.gguf", probe_file()))
    net = ProbeNet.from_file(f)
    x = np.random.default_rng(1).standard_normal((2, 40, N_EMBD)) * 3.0  # [B, S, n_embd]
    with torch.no_grad():
        unit, sub = net.probabilities(torch.from_numpy(x.astype(np.float32)))
    for b in range(2):
        np.testing.assert_allclose(unit[b].numpy(), numpy_probe(f, x[b]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            sub[b].numpy(), numpy_probe(f, x[b], "subunit."), rtol=1e-5, atol=1e-6
        )


def test_batched_probe_equals_one_sequence_at_a_time():
    net = random_net(3)
    x = torch.randn(3, 25, N_EMBD)
    with torch.no_grad():
        batched, _ = net(x)
        single = torch.stack([net(x[i])[0] for i in range(3)])
    torch.testing.assert_close(batched, single)


def test_smoothing_counts_the_raw_logit_twice_and_drops_out_of_range_taps():
    net = ProbeNet(N_EMBD, WIDTH, 5, subunit=False)
    with torch.no_grad():
        net.conv.weight.copy_(torch.tensor([[[1.0, 0.0, 2.0, 0.0, 4.0]]]))
        net.conv.bias.fill_(0.5)
    raw = torch.tensor([1.0, 10.0, 100.0])
    out = ProbeNet.smooth(raw, net.conv)
    # t=0: raw 1 + bias 0.5 + centre 2*1 + right-2 tap 4*100 (left taps out of range)
    assert out.tolist() == [
        1 + 0.5 + 2 * 1 + 4 * 100,
        10 + 0.5 + 2 * 10,
        100 + 0.5 + 1 * 1 + 2 * 100,
    ]


def test_segment_probe_reads_the_tap_of_a_score_result(tmp_path):
    probe = load_segment_probe(write_probe_gguf(tmp_path / "p.gguf", probe_file()), IDENTITY)
    tap = np.random.default_rng(2).standard_normal((30, N_EMBD)).astype(np.float32)
    boundary, subunit = probe(ScoreResult(mass=None, tap=tap))
    assert boundary.dtype == np.float32 and boundary.shape == (30,) and subunit.shape == (30,)
    np.testing.assert_allclose(boundary, numpy_probe(probe_file(), tap), rtol=1e-5, atol=1e-6)


def test_segment_probe_fails_closed_without_a_fitting_tap(tmp_path):
    probe = load_segment_probe(write_probe_gguf(tmp_path / "p.gguf", probe_file()), IDENTITY)
    with pytest.raises(CompressionFailed, match="no tap") as err:
        probe(ScoreResult(mass=None))
    assert err.value.stage == "probe"
    with pytest.raises(CompressionFailed, match=r"expected \[S, 12\]"):
        probe.boundaries(np.zeros((4, 11), np.float32))


def test_a_later_tap_runs_only_its_new_rows_through_the_probe(tmp_path):
    """The rows a drafter session reused keep the logits the probe computed for its parent
    tap; the result equals the whole tap through the probe, subunit head included."""
    path = write_probe_gguf(tmp_path / "p.gguf", probe_file())
    probe = load_segment_probe(path, IDENTITY, memo=4)
    scratch = load_segment_probe(path, IDENTITY)
    rng = np.random.default_rng(5)
    first = rng.standard_normal((40, N_EMBD)).astype(np.float32)
    later = np.concatenate((first[:32], rng.standard_normal((20, N_EMBD)).astype(np.float32)))
    rows_seen = []
    real = probe.net.raw_logits
    probe.net.raw_logits = lambda x: rows_seen.append(x.shape[0]) or real(x)

    probe(ScoreResult(mass=None, tap=first, tap_id="a"))
    out = probe(ScoreResult(mass=None, tap=later, scorer_resume=32, tap_id="b", tap_parent="a"))
    assert rows_seen == [40, 20]  # the second tap's 32 reused rows were not run again
    expected = scratch(ScoreResult(mass=None, tap=later))
    np.testing.assert_allclose(out[0], expected[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out[1], expected[1], rtol=1e-6, atol=1e-7)

    # an identical retry reuses every row
    again = probe(ScoreResult(mass=None, tap=later, scorer_resume=52, tap_id="d", tap_parent="b"))
    assert rows_seen[-1] == 0
    np.testing.assert_allclose(again[0], expected[0], rtol=1e-6, atol=1e-7)
    # a parent the memo does not hold (evicted, another replica): every row runs
    probe(ScoreResult(mass=None, tap=later, scorer_resume=32, tap_id="c", tap_parent="zz"))
    assert rows_seen[-1] == 52
    # no memo (drafter_sessions 0): nothing is kept
    scratch(ScoreResult(mass=None, tap=first, tap_id="a"))
    assert len(scratch.memo) == 0
