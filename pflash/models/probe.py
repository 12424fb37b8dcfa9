"""The segment probe: where units (functions, classes, files, paragraphs) start (§4.7, §7.2).

A small network reads the drafter's tap, the residual stream entering the scoring layer,
which the drafter computes anyway, so finding boundaries costs a LayerNorm and two small
matmuls per token:

    raw_t = fc2 . GELU(fc1 . LayerNorm(x_t) + b1) + b2          x: [S, n_embd] -> raw: [S]
    b_t   = sigmoid(raw_t + conv_b + sum_k w_k raw_{t+k-r})      r = taps // 2, zero padded

with an optional sub-unit head (a second fc2 and conv on the same trunk) used only to split
oversize segments. GELU is the tanh form because that is what ggml's `gelu` computes, so a
C runtime reading this file gives the same numbers.

The GGUF file (§7.2) is bound to one drafter file by sha256 and to one feature tap; every
metadata key is required, typed and range-checked, every tensor F32 with consistent
shapes. A bad file refuses to load with the key or tensor named; there is no fallback.
Our schema names put the drafter family first (`smollm2_135m_segment_probe_v2`), as the
reference does for Qwen3.5 (`qwen3_5_0_8b_segment_probe_v2`); the key layout is the
reference's.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pflash.compress.plan.segments import ProbeParams
from pflash.compress.scoring import ScoreResult, is_skipped_read_ahead
from pflash.config.artefacts import refuse_unbound, resolve_artefact
from pflash.errors import CompressionFailed, ModelUnavailable
from pflash.models.drafter.sessions import SessionTable

PROBE_ARCH = "segmentprobe"
NS = "segmentprobe"
SCHEMA_VERSIONS = ("v1", "v2")  # v2 carries the sub-unit head

UNIT_TENSORS = (
    "norm.weight",
    "norm.bias",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
    "conv.weight",
    "conv.bias",
)
SUBUNIT_TENSORS = (
    "subunit.fc2.weight",
    "subunit.fc2.bias",
    "subunit.conv.weight",
    "subunit.conv.bias",
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class ProbeIdentity:
    """What a probe file must state to run on this drafter: the drafter family
    (`smollm2_135m`), base model, feature tap, the drafter file's sha256, and the width of
    the tap (`n_embd`, the drafter's hidden size)."""

    family: str
    base_model: str
    feature_tap: str
    runtime_gguf_sha256: str
    n_embd: int

    @property
    def schemas(self) -> tuple[str, ...]:
        return tuple(f"{self.family}_segment_probe_{v}" for v in SCHEMA_VERSIONS)

    def schema(self, subunit: bool) -> str:
        return self.schemas[1 if subunit else 0]


def probe_identity(profile, drafter_path: str | Path, n_embd: int) -> ProbeIdentity:
    """The identity for a resolved `ScorerProfile`: its family is the scoring head schema's
    model part (`smollm2_135m_nope_qk_mass_v1` -> `smollm2_135m`)."""
    from pflash.models.drafter.scoring_head import drafter_sha256

    return ProbeIdentity(
        family=profile.schema.removesuffix("_nope_qk_mass_v1"),
        base_model=profile.base_model,
        feature_tap=profile.tap,
        runtime_gguf_sha256=drafter_sha256(drafter_path),
        n_embd=int(n_embd),
    )


def scorer_probe_identity(scorer) -> ProbeIdentity:
    """The identity a probe needs to read this `DrafterScorer`'s tap."""
    hidden = scorer.model.config.get_text_config().hidden_size
    return probe_identity(scorer.profile, scorer.loaded.source.path, hidden)


def drafter_probe_identity(config) -> ProbeIdentity:
    """The identity for `config.drafter` without reading its weights.

    The SegmentProbe deployment does not hold the drafter, so the model is built on the
    meta device from the file's own config (the same guarded config the loader uses) and
    the scorer profile is resolved on that; only the file's sha256 reads the whole file.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from pflash.models.drafter.profile import resolve_profile
    from pflash.models.gguf_io import read_gguf_facts
    from pflash.models.loading import LoadedModel, guard_gguf_config
    from pflash.models.source import resolve_source

    source = resolve_source(config.drafter)
    facts = None
    if source.is_gguf:
        facts = read_gguf_facts(source.path)
        hf = AutoConfig.from_pretrained(
            str(source.directory), gguf_file=source.gguf_file, local_files_only=True
        )
        hf = guard_gguf_config(hf, facts)
        architecture = facts.architecture
    else:
        hf = AutoConfig.from_pretrained(str(source.directory), local_files_only=True)
        hf._name_or_path = str(source.directory)  # what from_pretrained records
        architecture = hf.model_type
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    loaded = LoadedModel(model, source, None, 0.0, False, architecture, facts)
    profile = resolve_profile(loaded, config)
    return probe_identity(profile, source.path, hf.get_text_config().hidden_size)


# --------------------------------------------------------------------------- file format


@dataclass(frozen=True, eq=False)
class ProbeFile:
    """A probe GGUF's content. `tensors` maps leaf names (`fc1.weight`, `subunit.conv.bias`,
    ...) to float32 arrays in PyTorch layout: fc1.weight [width, n_embd], fc2.weight
    [width], conv.weight [taps], biases of fc2/conv [1], norm.* [n_embd]."""

    schema: str
    base_model: str
    runtime_gguf_sha256: str
    feature_tap: str
    threshold: float
    norm_eps: float
    min_segment: int
    max_segment: int
    conv_taps: int
    tensors: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def has_subunit(self) -> bool:
        return SUBUNIT_TENSORS[0] in self.tensors

    @property
    def n_embd(self) -> int:
        return int(self.tensors["norm.weight"].shape[0])

    @property
    def width(self) -> int:
        return int(self.tensors["fc1.weight"].shape[0])

    @property
    def params(self) -> ProbeParams:
        return ProbeParams(self.threshold, self.min_segment, self.max_segment)


def probe_fields(f: ProbeFile) -> dict[str, tuple[Any, str]]:
    """Metadata as written: key -> (value, GGUF type name)."""
    return {
        "general.architecture": (PROBE_ARCH, "STRING"),
        f"{NS}.schema": (f.schema, "STRING"),
        f"{NS}.base_model": (f.base_model, "STRING"),
        f"{NS}.runtime_gguf_sha256": (f.runtime_gguf_sha256, "STRING"),
        f"{NS}.feature_tap": (f.feature_tap, "STRING"),
        f"{NS}.threshold": (float(f.threshold), "FLOAT32"),
        f"{NS}.norm_eps": (float(f.norm_eps), "FLOAT32"),
        f"{NS}.min_segment": (int(f.min_segment), "UINT32"),
        f"{NS}.max_segment": (int(f.max_segment), "UINT32"),
        f"{NS}.conv_taps": (int(f.conv_taps), "UINT32"),
    }


def probe_tensors(f: ProbeFile) -> dict[str, np.ndarray]:
    """Tensors as written: full GGUF name -> float32 array (PyTorch layout; the file stores
    ggml order, so fc1.weight appears as [n_embd, width])."""
    return {f"{NS}.{k}": np.ascontiguousarray(v, dtype=np.float32) for k, v in f.tensors.items()}


def write_gguf(
    path: str | Path, fields: Mapping[str, tuple[Any, str]], tensors: Mapping[str, np.ndarray]
) -> Path:
    """Write exactly these metadata fields and tensors (tests write broken files with it)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), PROBE_ARCH)
    writer.kv_data[0].clear()  # general.architecture comes from `fields` like every key
    for key, (value, kind) in fields.items():
        writer.add_key_value(key, value, gguf.GGUFValueType[kind])
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def open_typed_gguf(path: Path, where: str):
    """A GGUF reader for `path` and `value(key, kind)`, which returns a metadata value only
    when it is present with exactly that GGUF type; else `ModelUnavailable` naming `where`
    (shared by the probe and tap projection files)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:
        raise ModelUnavailable(f"{where} is not a readable GGUF file: {err}") from err

    def value(key: str, kind: str):
        fld = reader.fields.get(key)
        if fld is None:
            raise ModelUnavailable(f"{where} lacks metadata key {key}")
        got = [t.name for t in fld.types]
        if got != [kind]:
            raise ModelUnavailable(f"{where}: {key} must be {kind}, got {'/'.join(got)}")
        return fld.contents()

    return reader, value


def write_probe_gguf(path: str | Path, f: ProbeFile) -> Path:
    """Write a probe file in the reference layout (§7.2)."""
    return write_gguf(path, probe_fields(f), probe_tensors(f))


def read_probe_gguf(path: str | Path) -> ProbeFile:
    """Read and validate a probe file on its own terms: every key present with its type and
    range, every tensor F32, finite and shaped consistently. `ModelUnavailable` names the
    file and what is wrong."""
    import gguf

    path = Path(path)
    where = f"segment probe {path}"
    if not path.is_file():
        raise ModelUnavailable(
            f"{where} not found; set segment_probe_gguf to an existing file or unset it"
        )
    reader, value = open_typed_gguf(path, where)

    arch = value("general.architecture", "STRING")
    if arch != PROBE_ARCH:
        raise ModelUnavailable(
            f"{where}: general.architecture is {arch!r}, expected {PROBE_ARCH!r}"
        )
    meta = {k: value(f"{NS}.{k}", "STRING") for k in ("schema", "base_model", "feature_tap")}
    meta["runtime_gguf_sha256"] = value(f"{NS}.runtime_gguf_sha256", "STRING")
    nums = {k: float(value(f"{NS}.{k}", "FLOAT32")) for k in ("threshold", "norm_eps")}
    ints = {
        k: int(value(f"{NS}.{k}", "UINT32")) for k in ("min_segment", "max_segment", "conv_taps")
    }
    _check_meta(where, meta, nums, ints)

    found = {t.name: t for t in reader.tensors}
    names = list(UNIT_TENSORS)
    present = [n for n in SUBUNIT_TENSORS if f"{NS}.{n}" in found]
    if present and len(present) != len(SUBUNIT_TENSORS):
        missing = [f"{NS}.{n}" for n in SUBUNIT_TENSORS if n not in present]
        raise ModelUnavailable(
            f"{where}: the sub-unit head needs all four tensors or none; missing {', '.join(missing)}"
        )
    names += present
    tensors = {}
    for name in names:
        t = found.get(f"{NS}.{name}")
        if t is None:
            raise ModelUnavailable(f"{where} lacks tensor {NS}.{name}")
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ModelUnavailable(f"{where}: {NS}.{name} must be F32, got {t.tensor_type.name}")
        array = np.array(t.data, dtype=np.float32).reshape(tuple(int(d) for d in t.shape[::-1]))
        if not np.all(np.isfinite(array)):
            raise ModelUnavailable(f"{where}: {NS}.{name} has non-finite values")
        tensors[name] = array
    _check_shapes(where, tensors, ints["conv_taps"])
    return ProbeFile(**meta, **nums, **ints, tensors=tensors)


def _check_meta(where: str, meta: dict, nums: dict, ints: dict) -> None:
    schema = meta["schema"]
    if not any(schema.endswith(f"_segment_probe_{v}") for v in SCHEMA_VERSIONS):
        raise ModelUnavailable(
            f"{where}: segmentprobe.schema {schema!r} is not a segment probe schema "
            "(<family>_segment_probe_v1 or _v2)"
        )
    if not _SHA256.match(meta["runtime_gguf_sha256"]):
        raise ModelUnavailable(
            f"{where}: segmentprobe.runtime_gguf_sha256 {meta['runtime_gguf_sha256']!r} is not "
            "a lowercase hex sha256"
        )
    t = nums["threshold"]
    if not (math.isfinite(t) and 0.0 < t < 1.0):
        raise ModelUnavailable(f"{where}: segmentprobe.threshold {t} is not in (0, 1)")
    eps = nums["norm_eps"]
    if not (math.isfinite(eps) and 0.0 < eps < 1.0):
        raise ModelUnavailable(f"{where}: segmentprobe.norm_eps {eps} is not in (0, 1)")
    if ints["min_segment"] < 1:
        raise ModelUnavailable(f"{where}: segmentprobe.min_segment {ints['min_segment']} is < 1")
    if ints["max_segment"] < ints["min_segment"]:
        raise ModelUnavailable(
            f"{where}: segmentprobe.max_segment {ints['max_segment']} is below min_segment "
            f"{ints['min_segment']}"
        )
    if ints["conv_taps"] % 2 != 1:
        raise ModelUnavailable(
            f"{where}: segmentprobe.conv_taps {ints['conv_taps']} is not a positive odd number"
        )


def _check_shapes(where: str, tensors: dict[str, np.ndarray], taps: int) -> None:
    n_embd = tensors["norm.weight"].shape[0] if tensors["norm.weight"].ndim == 1 else -1
    fc1 = tensors["fc1.weight"]
    width = fc1.shape[0] if fc1.ndim == 2 else -1
    want = {
        "norm.weight": (n_embd,),
        "norm.bias": (n_embd,),
        "fc1.weight": (width, n_embd),
        "fc1.bias": (width,),
        "fc2.weight": (width,),
        "fc2.bias": (1,),
        "conv.weight": (taps,),
        "conv.bias": (1,),
        "subunit.fc2.weight": (width,),
        "subunit.fc2.bias": (1,),
        "subunit.conv.weight": (taps,),
        "subunit.conv.bias": (1,),
    }
    if n_embd < 1 or width < 1:
        raise ModelUnavailable(
            f"{where}: {NS}.norm.weight must be [n_embd] and {NS}.fc1.weight [n_embd, width] "
            f"(ggml order); got {tensors['norm.weight'].shape[::-1]} and {fc1.shape[::-1]}"
        )
    for name, array in tensors.items():
        if array.shape != want[name]:
            raise ModelUnavailable(
                f"{where}: {NS}.{name} has ggml shape {list(array.shape[::-1])}, expected "
                f"{list(want[name][::-1])} (n_embd {n_embd}, width {width}, conv_taps {taps})"
            )


# --------------------------------------------------------------------------- the network


class ProbeNet(nn.Module):
    """The probe network in torch, batched over the tap: x [..., S, n_embd] -> logits [..., S].

    `forward` returns the smoothed logits (unit, sub-unit or None), i.e. the argument of the
    sigmoid; `probabilities` applies it. Training uses `forward` with a logit loss.
    """

    def __init__(
        self, n_embd: int, width: int, taps: int = 5, *, subunit: bool = True, eps: float = 1e-5
    ):
        super().__init__()
        if taps % 2 != 1:
            raise ValueError(f"conv taps must be odd, got {taps}")
        self.norm = nn.LayerNorm(n_embd, eps=eps)
        self.fc1 = nn.Linear(n_embd, width)
        self.fc2 = nn.Linear(width, 1)
        self.conv = nn.Conv1d(1, 1, taps, padding=taps // 2)
        self.subunit_fc2 = nn.Linear(width, 1) if subunit else None
        self.subunit_conv = nn.Conv1d(1, 1, taps, padding=taps // 2) if subunit else None

    @property
    def taps(self) -> int:
        return int(self.conv.kernel_size[0])

    def raw_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [..., S, n_embd] -> (unit raw [..., S], sub-unit raw [..., S] or None)."""
        h = F.gelu(self.fc1(self.norm(x)), approximate="tanh")  # [..., S, width]
        sub = self.subunit_fc2(h).squeeze(-1) if self.subunit_fc2 is not None else None
        return self.fc2(h).squeeze(-1), sub

    @staticmethod
    def smooth(raw: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
        """raw + conv(raw) along S (zero padded, conv bias included): [..., S] -> [..., S]."""
        s = raw.shape[-1]
        flat = raw.reshape(-1, 1, s)  # [N, 1, S]
        return raw + conv(flat).reshape(raw.shape)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        unit, sub = self.raw_logits(x)
        unit = self.smooth(unit, self.conv)
        if sub is not None:
            sub = self.smooth(sub, self.subunit_conv)
        return unit, sub

    def probabilities(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        unit, sub = self(x)
        return torch.sigmoid(unit), (torch.sigmoid(sub) if sub is not None else None)

    # ------------------------------------------------------------------ file <-> module
    @classmethod
    def from_file(cls, f: ProbeFile) -> ProbeNet:
        net = cls(f.n_embd, f.width, f.conv_taps, subunit=f.has_subunit, eps=f.norm_eps)
        t = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in f.tensors.items()}
        with torch.no_grad():
            net.norm.weight.copy_(t["norm.weight"])
            net.norm.bias.copy_(t["norm.bias"])
            net.fc1.weight.copy_(t["fc1.weight"])
            net.fc1.bias.copy_(t["fc1.bias"])
            for fc2, conv, prefix in _heads(net):
                fc2.weight.copy_(t[f"{prefix}fc2.weight"].view(1, -1))
                fc2.bias.copy_(t[f"{prefix}fc2.bias"])
                conv.weight.copy_(t[f"{prefix}conv.weight"].view(1, 1, -1))
                conv.bias.copy_(t[f"{prefix}conv.bias"])
        return net.eval()

    def tensors(self) -> dict[str, np.ndarray]:
        """This network's weights as `ProbeFile.tensors` (PyTorch layout, float32)."""

        def a(p: torch.Tensor) -> np.ndarray:
            return p.detach().float().cpu().numpy().copy()

        out = {
            "norm.weight": a(self.norm.weight),
            "norm.bias": a(self.norm.bias),
            "fc1.weight": a(self.fc1.weight),
            "fc1.bias": a(self.fc1.bias),
        }
        for fc2, conv, prefix in _heads(self):
            out[f"{prefix}fc2.weight"] = a(fc2.weight).reshape(-1)
            out[f"{prefix}fc2.bias"] = a(fc2.bias).reshape(1)
            out[f"{prefix}conv.weight"] = a(conv.weight).reshape(-1)
            out[f"{prefix}conv.bias"] = a(conv.bias).reshape(1)
        return out


def _heads(net: ProbeNet):
    yield net.fc2, net.conv, ""
    if net.subunit_fc2 is not None:
        yield net.subunit_fc2, net.subunit_conv, "subunit."


# --------------------------------------------------------------------------- the runtime


@dataclass(frozen=True, eq=False)
class SegmentProbe:
    """A loaded probe, bound to one drafter. Call it with the drafter's `ScoreResult`
    (the pipeline's `probe` callable) or `boundaries(tap)` with the tap itself.

    `memo`: the per-row logits of the drafter's recent taps, by `ScoreResult.tap_id`. Why:
    a conversation's later turn sends the whole tap again, and the network over every row is
    the probe's cost that grows with the conversation. The rows a drafter session reused
    (`scorer_resume`, from the tap its `tap_parent` names) are the very rows the probe read
    last time, and each row's logits depend on that row alone (norm, fc1, gelu, fc2): only
    the new rows go through the network, and the smoothing, which looks at neighbours, runs
    over the whole tap. A parent the memo no longer holds (evicted, another replica, a
    failed call) means every row goes through the network, as without a memo."""

    net: ProbeNet
    params: ProbeParams
    identity: ProbeIdentity
    path: str
    memo: SessionTable = field(default_factory=lambda: SessionTable(0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def boundaries(
        self, tap: np.ndarray, reused: RawLogits | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """tap float [S, n_embd] -> (unit probabilities float32 [S], sub-unit or None).
        `reused`: the raw logits of the first rows, known from an earlier pass over them."""
        return self._boundaries(tap, reused)[0]

    def _boundaries(self, tap, reused):
        tap = np.asarray(tap)
        if tap.ndim != 2 or tap.shape[1] != self.identity.n_embd:
            raise CompressionFailed(
                "probe", f"tap has shape {tap.shape}, expected [S, {self.identity.n_embd}]"
            )
        start = 0 if reused is None else int(reused[0].shape[0])
        x = torch.from_numpy(np.ascontiguousarray(tap[start:], dtype=np.float32))
        x = x.to(self.net.norm.weight.device)  # the net sits on the default device it was built on
        with torch.inference_mode():
            unit, sub = self.net.raw_logits(x)
            if reused is not None:
                unit = torch.cat((reused[0], unit))
                sub = torch.cat((reused[1], sub)) if sub is not None else None
            raw = (unit, sub)
            unit = torch.sigmoid(self.net.smooth(unit, self.net.conv))
            if sub is not None:
                sub = torch.sigmoid(self.net.smooth(sub, self.net.subunit_conv))
        if not bool(torch.isfinite(unit).all()):
            raise CompressionFailed("probe", "non-finite boundary probabilities")
        return (unit.cpu().numpy(), (sub.cpu().numpy() if sub is not None else None)), raw

    def __call__(self, scores: ScoreResult) -> tuple[np.ndarray, np.ndarray | None]:
        if is_skipped_read_ahead(scores):  # no pass ran: nothing to read, nothing to keep
            return np.zeros(0, dtype=np.float32), None
        if scores.tap is None:
            raise CompressionFailed(
                "probe", "the drafter returned no tap (the request must set want_tap)"
            )
        reused = None
        if scores.tap_parent is not None and scores.scorer_resume > 0:
            with self._lock:
                parent = self.memo.get(scores.tap_parent)
            if parent is not None and parent[0].shape[0] >= scores.scorer_resume:
                r = scores.scorer_resume
                reused = (parent[0][:r], parent[1][:r] if parent[1] is not None else None)
        out, raw = self._boundaries(scores.tap, reused)
        if scores.tap_id is not None:
            with self._lock:
                self.memo.put(scores.tap_id, raw)
        return out


RawLogits = tuple[torch.Tensor, torch.Tensor | None]  # unit [n], sub-unit [n] or None


def load_segment_probe(path: str | Path, expected: ProbeIdentity, memo: int = 0) -> SegmentProbe:
    """Read a probe file and bind it to the drafter `expected` describes; refuse with the
    mismatch named (schema, base model, tap, drafter sha256, tap width). `memo`: how many
    drafter taps' row logits to keep (`SegmentProbe.memo`; the drafter's session count)."""
    f = read_probe_gguf(path)
    where = f"segment probe {path}"
    if f.schema not in expected.schemas:
        raise ModelUnavailable(
            f"{where} does not fit this drafter: schema is {f.schema!r}, expected one of "
            f"{list(expected.schemas)}"
        )
    refuse_unbound("probe", path, f, expected, ("base_model", "feature_tap", "runtime_gguf_sha256"))
    if f.n_embd != expected.n_embd:
        raise ModelUnavailable(
            f"{where}: {NS}.norm.weight has {f.n_embd} features, the drafter's tap has "
            f"{expected.n_embd}"
        )
    return SegmentProbe(
        ProbeNet.from_file(f), f.params, expected, str(path), memo=SessionTable(memo)
    )


def probe_for(config, scorer) -> SegmentProbe | None:
    """The segment probe `config` asks for, bound to the in-process `scorer`; None when no
    probe is configured or segments are fixed (the probe would never be read)."""
    if not config.segment_probe_gguf or config.select_segments == "fixed":
        return None
    identity = scorer_probe_identity(scorer)
    path = resolve_artefact(
        "probe", config.segment_probe_gguf, config.drafter, identity.feature_tap
    )
    return load_segment_probe(path, identity, memo=config.drafter_sessions)
