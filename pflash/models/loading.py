"""Load a causal LM from a GGUF file, a local HF directory, or an embedded package.

A quantized GGUF is dequantized by transformers on load, which is slow; the converted model
is saved once (safetensors, keyed by the file's sha256) in the cache so later starts load it
as it is. Nothing is ever downloaded.

GGUF guards (spec/QWEN_GGUF.md). The architecture and shape come from the file's metadata,
never its name, and three known traps are fixed before the weights are loaded:

- qwen35 files from the newest converter count an MTP block in `block_count`; the decoder
  has `block_count - nextn_predict_layers` layers (§0, §7);
- the output head is tied exactly when the file has no `output.weight` (§5);
- transformers' legacy qwen3 path ignores `attention.key_length` and builds head_dim 128;
  the file's key_length is the head_dim (§6).

After loading, the model is checked against the same facts (layer count, key width, tie),
so a wrong conversion fails at startup rather than scoring with a broken drafter.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pflash.errors import ConfigError, ModelUnavailable
from pflash.models.gguf_io import GGUFFacts, read_gguf_facts
from pflash.models.source import ModelSource, cache_dir, file_sha256, resolve_source

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model ready for inference with where it came from and how long it took.

    `architecture` is the GGUF `general.architecture` (llama, qwen3, qwen35, ...) for GGUF
    sources and the config's model_type for HF directories; `gguf` holds the guarded facts.
    """

    model: object  # transformers PreTrainedModel, eval mode (float32 on CPU, bfloat16 on GPU)
    source: ModelSource
    sha256: str | None
    load_seconds: float
    from_cache: bool
    architecture: str = ""
    gguf: GGUFFacts | None = None


def _converted_dir(source: ModelSource) -> Path:
    return cache_dir() / "models" / file_sha256(str(source.path))


def _save_dequantized(model, directory: Path) -> None:
    """Save a GGUF-loaded (already dequantized) model as a plain HF directory.

    transformers refuses `save_pretrained` on a model it marked as gguf-quantized; the
    weights are ordinary float tensors by now, so drop the marker and save them.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(str(directory), safe_serialization=True)


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def guard_gguf_config(config, facts: GGUFFacts):
    """Fix the config transformers built from a GGUF header with the file's own facts."""
    text = config.get_text_config()
    if text.num_hidden_layers != facts.n_layer:
        log.info(
            "%s: %d decoder layers (block_count %d - nextn %d), not %d",
            facts.path,
            facts.n_layer,
            facts.block_count,
            facts.nextn_layers,
            text.num_hidden_layers,
        )
        text.num_hidden_layers = facts.n_layer
        if getattr(text, "layer_types", None) is not None:
            text.layer_types = list(text.layer_types[: facts.n_layer])
    if facts.key_length and _head_dim(text) != facts.key_length:
        log.info(
            "%s: head_dim %d from attention.key_length (config said %d)",
            facts.path,
            facts.key_length,
            _head_dim(text),
        )
        text.head_dim = int(facts.key_length)
    config.tie_word_embeddings = facts.tied_output
    text.tie_word_embeddings = facts.tied_output
    return config


def check_against_facts(model, facts: GGUFFacts) -> None:
    """Fail at startup when the loaded model disagrees with what the GGUF file says."""
    text = model.config.get_text_config()
    layers = model.model.layers
    problems = []
    if len(layers) != facts.n_layer or text.num_hidden_layers != facts.n_layer:
        problems.append(f"{len(layers)} layers loaded, file has {facts.n_layer} decoder blocks")
    if facts.key_length and facts.head_count_kv:
        attn = next((layer.self_attn for layer in layers if hasattr(layer, "self_attn")), None)
        want = facts.key_length * facts.head_count_kv
        if attn is not None and attn.k_proj.out_features != want:
            problems.append(
                f"k_proj width {attn.k_proj.out_features}, file says {want} (key_length x head_count_kv)"
            )
    out, emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = out is not None and out.weight.data_ptr() == emb.weight.data_ptr()
    if tied != facts.tied_output:
        problems.append(
            f"output head {'tied' if tied else 'untied'}, file says {'tied' if facts.tied_output else 'untied'}"
        )
    if problems:
        raise ModelUnavailable(
            f"GGUF {facts.path} ({facts.architecture}) loaded wrongly: " + "; ".join(problems)
        )


def _load_gguf(source: ModelSource, facts: GGUFFacts, torch_dtype):
    """Dequantize through transformers with the guarded config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(
            str(source.directory), gguf_file=source.gguf_file, local_files_only=True
        )
    except ValueError as err:
        raise ModelUnavailable(
            f"GGUF {source.path}: architecture {facts.architecture!r} is not loadable: {err}"
        ) from err
    config = guard_gguf_config(config, facts)
    return AutoModelForCausalLM.from_pretrained(
        str(source.directory),
        gguf_file=source.gguf_file,
        config=config,
        dtype=torch_dtype,
        local_files_only=True,
    )


def resolve_device(choice: str = "auto") -> str:
    """ "cuda" when asked, or when "auto" and a GPU is visible to this process; else "cpu".

    Asking for cuda where torch sees no GPU is a `ConfigError` naming the `device` key and
    the fixes, at startup: a replica that silently fell back to the CPU would score 128K
    tokens in minutes instead of seconds."""
    import torch

    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device",
            choice,
            "torch sees no GPU in this process (torch.cuda.is_available() is False): set "
            "device: cpu (or auto), or run the replica with a GPU (ray_actor_options "
            "num_gpus) and a CUDA build of torch",
        )
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def model_dtype(device: str) -> str:
    """The dtype a model's weights are loaded in on `device`: bfloat16 on a GPU (its matmul
    units' native type; half the memory), float32 on a CPU (bfloat16 there is emulated on
    most CPUs and slower). The scorer's softmax and mass run in float32 either way."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def use_device(choice: str = "auto") -> str:
    """Make `choice` this process's default torch device (a replica owns its process), so
    tensors the scorer and target create land beside the weights. Returns the device."""
    import torch

    device = resolve_device(choice)
    torch.set_default_device(device)
    return device


def load_causal_lm(spec: str, *, dtype: str | None = None, device: str = "cpu") -> LoadedModel:
    """Load `spec` as an AutoModelForCausalLM in eval mode on `device`, its weights in
    `dtype` (None = `model_dtype(device)`: float32 on CPU, bfloat16 on a GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve_source(spec)
    t0 = time.perf_counter()
    torch_dtype = getattr(torch, dtype or model_dtype(device))
    facts = None
    if not source.is_gguf:
        model = AutoModelForCausalLM.from_pretrained(
            str(source.directory), dtype=torch_dtype, local_files_only=True
        )
        sha, from_cache = None, False
        architecture = model.config.model_type
    else:
        sha = file_sha256(str(source.path))
        facts = read_gguf_facts(source.path)
        architecture = facts.architecture
        converted = _converted_dir(source)
        from_cache = (converted / "config.json").is_file()
        model = None
        if from_cache:
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    str(converted), dtype=torch.float32, local_files_only=True
                )
                check_against_facts(model, facts)
            except Exception as err:  # half-written, or converted by an older, unguarded loader
                log.warning("discarding cached conversion %s: %s", converted, err)
                shutil.rmtree(converted, ignore_errors=True)
                model, from_cache = None, False
        if model is None:
            # dequantized and cached in float32 whatever this load asks for: the cache is
            # keyed by the file alone, so a GPU load must not leave bfloat16-rounded
            # weights for a later CPU load
            model = _load_gguf(source, facts, torch.float32)
            tmp = converted.with_name(converted.name + f".tmp{os.getpid()}")
            _save_dequantized(model, tmp)
            if converted.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.replace(tmp, converted)
        check_against_facts(model, facts)
    model.to(device=device, dtype=torch_dtype)
    model.eval()
    seconds = time.perf_counter() - t0
    log.info(
        "loaded %s (%s) in %.1f s (%s)",
        spec,
        architecture,
        seconds,
        "cached conversion" if from_cache else "converted",
    )
    return LoadedModel(
        model=model,
        source=source,
        sha256=sha,
        load_seconds=seconds,
        from_cache=from_cache,
        architecture=architecture,
        gguf=facts,
    )
