"""Load a causal LM from a GGUF file, a local HF directory, or an embedded package.

A quantized GGUF is dequantized by transformers on load, which takes ~20 s for SmolLM2 on
this CPU; the converted model is saved once (safetensors, keyed by the file's sha256) in
the cache so later starts load in about a second. Nothing is ever downloaded.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pflash.models.source import ModelSource, cache_dir, file_sha256, resolve_source

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model ready for inference with where it came from and how long it took."""

    model: object  # transformers PreTrainedModel, eval mode, float32
    source: ModelSource
    sha256: str | None
    load_seconds: float
    from_cache: bool


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


def load_causal_lm(spec: str, *, dtype: str = "float32") -> LoadedModel:
    """Load `spec` as an AutoModelForCausalLM in eval mode on CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve_source(spec)
    t0 = time.perf_counter()
    torch_dtype = getattr(torch, dtype)
    if not source.is_gguf:
        model = AutoModelForCausalLM.from_pretrained(str(source.directory), dtype=torch_dtype, local_files_only=True)
        sha, from_cache = None, False
    else:
        sha = file_sha256(str(source.path))
        converted = _converted_dir(source)
        from_cache = (converted / "config.json").is_file()
        if from_cache:
            model = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch_dtype, local_files_only=True)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                str(source.directory), gguf_file=source.gguf_file, dtype=torch_dtype, local_files_only=True
            )
            tmp = converted.with_name(converted.name + f".tmp{os.getpid()}")
            _save_dequantized(model, tmp)
            if converted.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.replace(tmp, converted)
    model.eval()
    seconds = time.perf_counter() - t0
    log.info("loaded %s in %.1f s (%s)", spec, seconds, "cached conversion" if from_cache else "converted")
    return LoadedModel(model=model, source=source, sha256=sha, load_seconds=seconds, from_cache=from_cache)
