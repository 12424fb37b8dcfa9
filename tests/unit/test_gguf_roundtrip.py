"""GGUF round trips: tiny random models written the converter's way load back identically.

The writer (`write_decoder_gguf`) follows spec/QWEN_GGUF.md §3-§6 with gguf-py's own
TensorNameMap; the loader is our `load_causal_lm` (transformers' GGUF path plus our guards).
Shapes are checked against llama.cpp's `create_tensor` table copied from the fact sheet,
which is independent of both.
"""

from __future__ import annotations

import json

import pytest
import torch

from pflash.models.gguf_io import (
    read_ggml_shapes,
    read_gguf_facts,
    tiny_decoder,
    write_decoder_gguf,
)
from pflash.models.loading import guard_gguf_config, load_causal_lm

torch.set_num_threads(1)

CASES = {
    # name: (kind, tied, mtp_layers)
    "qwen3-untied": ("qwen3", False, 0),
    "qwen3-tied": ("qwen3", True, 0),
    "qwen35-untied": ("qwen3_5", False, 0),
    "qwen35-tied-mtp": ("qwen3_5", True, 1),
    "llama-tied": ("llama", True, 0),
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLASH_CACHE_DIR", str(tmp_path / "cache"))


def write_case(tmp_path, name):
    kind, tied, mtp = CASES[name]
    model = tiny_decoder(kind, tied=tied, seed=hash(name) % 1000)
    path = write_decoder_gguf(model, tmp_path / f"{name}.gguf", mtp_layers=mtp)
    return model, path


def logits(model, ids):
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            return model(ids).logits
    finally:
        model.config._attn_implementation = impl


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_round_trip_gives_identical_logits(tmp_path, name):
    model, path = write_case(tmp_path, name)
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    want = logits(model, ids)
    first = load_causal_lm(str(path))
    assert not first.from_cache
    torch.testing.assert_close(logits(first.model, ids), want, atol=1e-5, rtol=0)
    again = load_causal_lm(str(path))  # from the sha256-keyed safetensors cache
    assert again.from_cache
    torch.testing.assert_close(logits(again.model, ids), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_facts_come_from_metadata_not_the_file_name(tmp_path, name):
    kind, tied, mtp = CASES[name]
    _, path = write_case(tmp_path, name)
    misleading = path.rename(tmp_path / "Qwen3.5-0.8B-llama-qwen3.gguf")
    facts = read_gguf_facts(misleading)
    assert facts.architecture == {"qwen3": "qwen3", "qwen3_5": "qwen35", "llama": "llama"}[kind]
    assert (facts.block_count, facts.nextn_layers, facts.n_layer) == (4 + mtp, mtp, 4)
    assert facts.tied_output is tied
    loaded = load_causal_lm(str(misleading))
    assert loaded.architecture == facts.architecture
    assert len(loaded.model.model.layers) == 4
    tied_now = (
        loaded.model.lm_head.weight.data_ptr() == loaded.model.model.embed_tokens.weight.data_ptr()
    )
    assert tied_now is tied


def qwen35_ggml_shapes(cfg, mtp: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """llama.cpp qwen35 `create_tensor` shapes (ne0 first), QWEN_GGUF.md §3."""
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    nk, nv, dk, dv, k = (
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
        cfg.linear_conv_kernel_dim,
    )
    conv = 2 * nk * dk + nv * dv
    out = {"token_embd.weight": (h, v), "output_norm.weight": (h,)}
    if not tied:
        out["output.weight"] = (h, v)
    n = cfg.num_hidden_layers
    for i in range(n + mtp):
        b = f"blk.{i}."
        out |= {b + "attn_norm.weight": (h,), b + "post_attention_norm.weight": (h,)}
        out |= {
            b + "ffn_gate.weight": (h, f),
            b + "ffn_up.weight": (h, f),
            b + "ffn_down.weight": (f, h),
        }
        if i >= n or cfg.layer_types[i] == "full_attention":
            out |= {
                b + "attn_q.weight": (h, 2 * nh * hd),
                b + "attn_k.weight": (h, nkv * hd),
                b + "attn_v.weight": (h, nkv * hd),
                b + "attn_output.weight": (nh * hd, h),
                b + "attn_q_norm.weight": (hd,),
                b + "attn_k_norm.weight": (hd,),
            }
        else:
            out |= {
                b + "attn_qkv.weight": (h, conv),
                b + "attn_gate.weight": (h, nv * dv),
                b + "ssm_beta.weight": (h, nv),
                b + "ssm_alpha.weight": (h, nv),
                b + "ssm_conv1d.weight": (k, conv),
                b + "ssm_dt.bias": (nv,),
                b + "ssm_a": (nv,),
                b + "ssm_norm.weight": (dv,),
                b + "ssm_out.weight": (nv * dv, h),
            }
        if i >= n:
            out |= {
                b + "nextn.eh_proj.weight": (2 * h, h),
                b + "nextn.enorm.weight": (h,),
                b + "nextn.hnorm.weight": (h,),
                b + "nextn.shared_head_norm.weight": (h,),
            }
    return out


def qwen3_ggml_shapes(cfg, tied: bool) -> dict[str, tuple[int, ...]]:
    """llama.cpp qwen3 shapes (QWEN_GGUF.md §6): post_attention_layernorm is ffn_norm."""
    h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    out = {"token_embd.weight": (h, v), "output_norm.weight": (h,)}
    if not tied:
        out["output.weight"] = (h, v)
    for i in range(cfg.num_hidden_layers):
        b = f"blk.{i}."
        out |= {
            b + "attn_norm.weight": (h,),
            b + "ffn_norm.weight": (h,),
            b + "attn_q.weight": (h, nh * hd),
            b + "attn_k.weight": (h, nkv * hd),
            b + "attn_v.weight": (h, nkv * hd),
            b + "attn_output.weight": (nh * hd, h),
            b + "attn_q_norm.weight": (hd,),
            b + "attn_k_norm.weight": (hd,),
            b + "ffn_gate.weight": (h, f),
            b + "ffn_up.weight": (h, f),
            b + "ffn_down.weight": (f, h),
        }
    return out


@pytest.mark.parametrize("name", ["qwen3-untied", "qwen3-tied", "qwen35-untied", "qwen35-tied-mtp"])
def test_written_tensor_shapes_match_llama_cpp_table(tmp_path, name):
    kind, tied, mtp = CASES[name]
    model, path = write_case(tmp_path, name)
    want = (
        qwen35_ggml_shapes(model.config, mtp, tied)
        if kind == "qwen3_5"
        else qwen3_ggml_shapes(model.config, tied)
    )
    assert read_ggml_shapes(path) == want


def test_qwen35_values_carry_the_converter_transforms(tmp_path):
    import gguf

    model, path = write_case(tmp_path, "qwen35-untied")
    tensors = {t.name: t.data for t in gguf.GGUFReader(str(path)).tensors}
    layer = model.model.layers[0]
    norm = layer.input_layernorm.weight.detach().numpy()
    assert tensors["blk.0.attn_norm.weight"] == pytest.approx(
        norm + 1, abs=1e-6
    )  # zero-centred norm +1
    gated = layer.linear_attn.norm.weight.detach().numpy()
    assert tensors["blk.0.ssm_norm.weight"] == pytest.approx(
        gated, abs=0
    )  # the one norm without +1
    a_log = layer.linear_attn.A_log.detach().numpy()
    assert (tensors["blk.0.ssm_a"] < 0).all()
    # tiled value heads (nk=2, nv=6): ggml head j*nk+g holds HF head g*r+j
    tiled = tensors["blk.0.ssm_a"]
    assert tiled[1 * 2 + 0] == pytest.approx(-float(torch.tensor(a_log[0 * 3 + 1]).exp()), rel=1e-6)


def test_qwen3_head_dim_comes_from_key_length(tmp_path):
    from transformers import AutoConfig

    _, path = write_case(tmp_path, "qwen3-untied")  # head_dim 24: neither 64/4 nor 128
    facts = read_gguf_facts(path)
    assert facts.key_length == 24
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    assert config.head_dim != 24  # transformers' qwen3 GGUF path ignores attention.key_length
    assert guard_gguf_config(config, facts).head_dim == 24


@pytest.mark.parametrize("key, value", [("num_hidden_layers", 3), ("head_dim", 128)])
def test_a_cached_conversion_that_disagrees_with_the_file_is_rebuilt(tmp_path, key, value):
    model, path = write_case(tmp_path, "qwen3-untied")
    first = load_causal_lm(str(path))
    cached = next((tmp_path / "cache" / "models").iterdir())
    config = json.loads((cached / "config.json").read_text())
    config[key] = value  # as an older, unguarded conversion could have saved it
    (cached / "config.json").write_text(json.dumps(config))
    again = load_causal_lm(str(path))
    assert not again.from_cache
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        logits(again.model, ids), logits(first.model, ids), atol=1e-5, rtol=0
    )
