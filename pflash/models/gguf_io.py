"""GGUF facts, writers and the scoring-head file format.

Three jobs, all on top of gguf-py (the converter's own library) and transformers' header reader:

- `read_gguf_facts`: the few metadata facts our loader guards (architecture, decoder layer
  count net of the MTP block, head_dim, whether the output head is tied), read in
  milliseconds from the header, never from the file name (spec/QWEN_GGUF.md §0, §5, §6).
- `write_decoder_gguf`: write a small transformers model (llama, qwen3, qwen3_5) the way
  llama.cpp's `convert_hf_to_gguf` does: names from gguf-py's `TensorNameMap`, the Qwen3.5
  value transforms (+1 on zero-centred norms, `ssm_a = -exp(A_log)`, squeezed conv1d,
  grouped->tiled value heads), llama's q/k rope permutation, the same metadata keys, an
  optional fake MTP block. It exists so tests can round-trip tiny random models through
  our loading path; it is not a general converter.
- `write_scoring_head_gguf` / `read_scoring_head_gguf`: the trained scoring head (§7.1).

Axis order: gguf-py takes and returns numpy arrays in PyTorch order ([out, in]); the file
stores ggml `ne` reversed ([in, out]). `ggml_shape` gives the latter for shape checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pflash.errors import ModelUnavailable

SCORING_HEAD_ARCH = "pflash_scoring_head"
SCORING_HEAD_KEYS = ("schema", "base_model", "runtime_gguf_sha256", "feature_tap")


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class GGUFFacts:
    """What a GGUF file says about the decoder it holds (metadata and tensor names only)."""

    path: str
    architecture: str
    block_count: int
    nextn_layers: int  # MTP blocks counted in block_count (newest qwen35 converter)
    head_count: int | None
    head_count_kv: int | None
    key_length: int | None  # head_dim when the converter wrote it
    embedding_length: int | None
    tied_output: bool  # no `output.weight` tensor: llama.cpp reuses token_embd
    name: str | None = None  # general.name
    basename: str | None = None
    size_label: str | None = None

    @property
    def n_layer(self) -> int:
        """Decoder layers: the file's block_count minus its MTP blocks."""
        return self.block_count - self.nextn_layers


def read_gguf_facts(path: str | Path) -> GGUFFacts:
    """Read the guarded facts from a GGUF header (the header only, no tensor data)."""
    from transformers.integrations.gguf import read_gguf_metadata

    try:
        meta, tensor_names = read_gguf_metadata(str(path))
    except Exception as err:  # a truncated or non-GGUF file
        raise ModelUnavailable(f"cannot read GGUF header of {path}: {err}") from err
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelUnavailable(f"GGUF file {path} has no general.architecture")

    def key(name: str):
        return meta.get(f"{arch}.{name}")

    if key("block_count") is None:
        raise ModelUnavailable(f"GGUF file {path} ({arch}) has no {arch}.block_count")
    return GGUFFacts(
        path=str(path),
        architecture=arch,
        block_count=int(key("block_count")),
        nextn_layers=int(key("nextn_predict_layers") or 0),
        head_count=key("attention.head_count"),
        head_count_kv=key("attention.head_count_kv"),
        key_length=key("attention.key_length"),
        embedding_length=key("embedding_length"),
        tied_output="output.weight" not in tensor_names,
        name=meta.get("general.name"),
        basename=meta.get("general.basename"),
        size_label=meta.get("general.size_label"),
    )


def read_ggml_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's ggml `ne` (ne0 first), as llama.cpp's `create_tensor` checks it."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}


# --------------------------------------------------------------------------- tiny models


def tiny_decoder(
    kind: str, *, layers: int = 4, tied: bool = False, seed: int = 0, vocab: int = 300
):
    """A tiny random-weight causal LM for tests and benchmarks: llama, qwen3 or qwen3_5.

    Shapes exercise what the real drafters have and defaults would hide: key heads != query
    heads (GQA), a head_dim that is neither hidden/heads nor transformers' qwen3 default
    (qwen3), key heads != value heads in the linear attention (qwen3_5, so the value-head
    reorder matters), and non-trivial norms, A_log and dt_bias.
    """
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3_5ForCausalLM,
        Qwen3_5TextConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        tie_word_embeddings=tied,
    )
    if kind == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2)
        )
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(
            Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=24)
        )
    elif kind == "qwen3_5":
        config = Qwen3_5TextConfig(
            **common,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=6,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            linear_conv_kernel_dim=4,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        )
        model = Qwen3_5ForCausalLM(config)
    else:
        raise ValueError(f"tiny_decoder kind must be llama, qwen3 or qwen3_5; got {kind!r}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("A_log", "dt_bias")):
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


# --------------------------------------------------------------------------- model writer

GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen3_5_text": "qwen35", "qwen3_5": "qwen35"}


def _tiled_from_grouped(x: np.ndarray, nk: int, r: int, axis: int = 0) -> np.ndarray:
    """Value heads grouped (HF: head g*r+j) -> tiled (ggml: head j*nk+g) along `axis` (§4.5)."""
    x = np.moveaxis(x, axis, 0)
    n = x.shape[0]
    hd = n // (nk * r)
    y = x.reshape(nk, r, hd, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
    return np.moveaxis(y, 0, axis)


def _llama_rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The converter's q/k row permutation for llama (HF half-split rope -> interleaved)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _qwen35_value(name: str, w: np.ndarray, cfg) -> tuple[str, np.ndarray]:
    """Apply Qwen3.5's converter transforms to one HF tensor; returns the (renamed) HF name."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    r = nv // nk
    key_dim = nk * cfg.linear_key_head_dim
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        w = w + np.float32(1.0)  # zero-centred RMSNorm stored as w + 1
    if name.endswith("linear_attn.A_log"):
        w = -np.exp(w)
    if name.endswith("linear_attn.dt_bias"):
        name = name.replace("dt_bias", "dt_proj.bias")
    if name.endswith("linear_attn.conv1d.weight"):
        w = w.squeeze(1)  # [conv_dim, 1, K] -> [conv_dim, K]
    if r > 1:  # grouped -> tiled value heads, only when key heads != value heads
        if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
            w = np.concatenate(
                [w[: 2 * key_dim], _tiled_from_grouped(w[2 * key_dim :], nk, r)], axis=0
            )
        elif name.endswith(
            ("in_proj_z.weight", "in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_proj.bias")
        ):
            w = _tiled_from_grouped(w, nk, r)
        elif name.endswith("out_proj.weight"):
            w = _tiled_from_grouped(w, nk, r, axis=1)
    return name, w


def _add_metadata(writer, arch: str, cfg, *, n_blocks: int, mtp_layers: int, vocab: int) -> None:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_block_count(n_blocks)
    writer.add_context_length(int(cfg.max_position_embeddings))
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    rope = cfg.rope_parameters or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_file_type(0)  # ALL_F32
    if arch in ("qwen3", "qwen35"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "llama":
        writer.add_vocab_size(vocab)
        writer.add_rope_dimension_count(head_dim)
    if arch == "qwen35":
        partial = float(rope.get("partial_rotary_factor", 0.25))
        writer.add_rope_dimension_count(int(head_dim * partial))
        sections = list(rope.get("mrope_section", [11, 11, 10]))
        writer.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
        writer.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
        writer.add_ssm_state_size(cfg.linear_key_head_dim)
        writer.add_ssm_group_count(cfg.linear_num_key_heads)
        writer.add_ssm_time_step_rank(cfg.linear_num_value_heads)
        writer.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
        writer.add_full_attention_interval(int(getattr(cfg, "full_attention_interval", 4)))
        if mtp_layers:
            writer.add_nextn_predict_layers(mtp_layers)
    # a stand-in vocabulary: the loader takes the vocab size from the token list length
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre({"qwen3": "qwen2", "qwen35": "qwen35"}.get(arch, "default"))
    writer.add_token_list([f"<t{i}>" for i in range(vocab)])
    writer.add_token_types([1] * vocab)


def _fake_mtp_tensors(model, n_layer: int, seed: int) -> dict[str, np.ndarray]:
    """HF-named tensors of one random MTP block at index n_layer (a full-attention layer plus
    the nextn projections), as `_Qwen35MtpMixin` renames `mtp.*` before mapping."""
    rng = np.random.default_rng(seed)
    out = {}
    full = next(i for i, t in enumerate(model.config.layer_types) if t == "full_attention")
    for name, p in model.model.layers[full].state_dict().items():
        out[f"model.layers.{n_layer}.{name}"] = (
            rng.standard_normal(p.shape).astype(np.float32) * 0.02
        )
    h = model.config.hidden_size
    out[f"model.layers.{n_layer}.eh_proj.weight"] = (
        rng.standard_normal((h, 2 * h)).astype(np.float32) * 0.02
    )
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        out[f"model.layers.{n_layer}.{norm}.weight"] = (
            rng.standard_normal(h).astype(np.float32) * 0.1
        )
    return out


def write_decoder_gguf(model, path: str | Path, *, mtp_layers: int = 0, seed: int = 0) -> Path:
    """Write a transformers causal LM (llama, qwen3, qwen3_5 text) as an F32 GGUF file.

    Follows the converter: tied models get no `output.weight`; qwen35 gets the value
    transforms and, with `mtp_layers`, fake MTP blocks counted in block_count with
    `nextn_predict_layers` set. Tensors are F32 so a round trip is exact.
    """
    import gguf

    cfg = model.config
    arch = GGUF_ARCH.get(cfg.model_type)
    if arch is None:
        raise ValueError(f"write_decoder_gguf supports llama, qwen3, qwen3_5; got {cfg.model_type}")
    if mtp_layers and arch != "qwen35":
        raise ValueError("only qwen35 files carry MTP blocks")
    n_layer = cfg.num_hidden_layers
    n_blocks = n_layer + mtp_layers
    names = gguf.TensorNameMap(gguf.MODEL_ARCH[arch.upper()], n_blocks)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for j in range(mtp_layers):
        state.update(_fake_mtp_tensors(model, n_layer + j, seed + j))

    writer = gguf.GGUFWriter(str(path), arch)
    _add_metadata(writer, arch, cfg, n_blocks=n_blocks, mtp_layers=mtp_layers, vocab=cfg.vocab_size)
    nextn = {
        "eh_proj": gguf.MODEL_TENSOR.NEXTN_EH_PROJ,
        "enorm": gguf.MODEL_TENSOR.NEXTN_ENORM,
        "hnorm": gguf.MODEL_TENSOR.NEXTN_HNORM,
        "shared_head.norm": gguf.MODEL_TENSOR.NEXTN_SHARED_HEAD_NORM,
    }
    for hf_name, w in state.items():
        if arch == "qwen35":
            hf_name, w = _qwen35_value(hf_name, w, cfg)
        if arch == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
            w = _llama_rope_permute(w, cfg.num_attention_heads)
        if arch == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
            w = _llama_rope_permute(w, cfg.num_key_value_heads)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:  # nextn tensors are not in gguf 0.19's QWEN35 table
            bid, leaf = hf_name.split(".", 3)[2], hf_name.split(".", 3)[3].removesuffix(".weight")
            gguf_name = gguf.TENSOR_NAMES[nextn[leaf]].format(bid=bid) + ".weight"
        writer.add_tensor(gguf_name, np.ascontiguousarray(w, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


# --------------------------------------------------------------------------- scoring head


@dataclass(frozen=True)
class ScoringHeadFile:
    """A scoring head GGUF's content (§7.1). Weights in PyTorch Linear layout [out, in]."""

    schema: str
    base_model: str
    runtime_gguf_sha256: str
    feature_tap: str
    attn_q: np.ndarray  # [n_head * head_dim, n_embd], query rows only (no gate)
    attn_k: np.ndarray  # [n_head_kv * head_dim, n_embd]


def write_scoring_head_gguf(path: str | Path, head: ScoringHeadFile) -> Path:
    """Write `head` in the reference layout: arch `pflash_scoring_head`, F32 tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), SCORING_HEAD_ARCH)
    for key in SCORING_HEAD_KEYS:
        writer.add_string(f"scoringhead.{key}", getattr(head, key))
    writer.add_tensor(
        "scoringhead.attn_q.weight", np.ascontiguousarray(head.attn_q, dtype=np.float32)
    )
    writer.add_tensor(
        "scoringhead.attn_k.weight", np.ascontiguousarray(head.attn_k, dtype=np.float32)
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def read_scoring_head_gguf(path: str | Path) -> ScoringHeadFile:
    """Read a scoring head file; a missing key, tensor or wrong type is `ModelUnavailable`."""
    import gguf

    path = Path(path)
    if not path.is_file():
        raise ModelUnavailable(
            f"scoring head {path} not found; set scoring_head_gguf to an existing file or unset it"
        )
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:
        raise ModelUnavailable(f"scoring head {path} is not a readable GGUF file: {err}") from err

    def string(key: str) -> str:
        field = reader.fields.get(key)
        if field is None:
            raise ModelUnavailable(f"scoring head {path} lacks metadata key {key}")
        value = field.contents()
        if not isinstance(value, str):
            raise ModelUnavailable(f"scoring head {path}: {key} is not a string")
        return value

    arch = string("general.architecture")
    if arch != SCORING_HEAD_ARCH:
        raise ModelUnavailable(
            f"scoring head {path}: general.architecture is {arch!r}, expected {SCORING_HEAD_ARCH!r}"
        )
    meta = {key: string(f"scoringhead.{key}") for key in SCORING_HEAD_KEYS}
    tensors = {t.name: t for t in reader.tensors}
    weights = {}
    for leaf in ("attn_q", "attn_k"):
        t = tensors.get(f"scoringhead.{leaf}.weight")
        if t is None:
            raise ModelUnavailable(f"scoring head {path} lacks tensor scoringhead.{leaf}.weight")
        if t.tensor_type != gguf.GGMLQuantizationType.F32 or len(t.shape) != 2:
            raise ModelUnavailable(
                f"scoring head {path}: scoringhead.{leaf}.weight must be a 2-D F32 tensor"
            )
        weights[leaf] = np.array(t.data, dtype=np.float32)
    return ScoringHeadFile(**meta, **weights)
