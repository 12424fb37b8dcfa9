"""The target's KV cache appends in place: the same logits as transformers' own cache, with
no copy of the whole cache per decoded token. A tiny random-weight llama (GQA, as the
benchmark's big target) runs both."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from pflash.models.kv_buffer import MIN_HEADROOM, BufferLayer, buffered_cache, headroom
from pflash_lab.bench.speculative import random_assistant


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return random_assistant(512, hidden=64, layers=3)


def _run(model, cache, ids: torch.Tensor, chunk: int, decode: int) -> torch.Tensor:
    """Prefill `ids` in chunks, then greedy-decode `decode` tokens; the logits of each step."""
    out = []
    with torch.inference_mode():
        for b in range(0, ids.shape[1], chunk):
            logits = model(input_ids=ids[:, b : b + chunk], cache=cache, use_cache=True).logits
            out.append(logits[0, -1])
        token = logits[:, -1:].argmax(-1)
        for _ in range(decode):
            logits = model(input_ids=token, cache=cache, use_cache=True).logits
            out.append(logits[0, -1])
            token = logits[:, -1:].argmax(-1)
    return torch.stack(out)


def test_a_buffered_cache_gives_the_logits_of_transformers_cache(model):
    ids = torch.randint(0, 512, (1, 300), generator=torch.Generator().manual_seed(1))
    plain = _run(model, DynamicCache(config=model.config), ids, chunk=64, decode=20)
    buffered = _run(model, buffered_cache(model), ids, chunk=64, decode=20)
    torch.testing.assert_close(buffered, plain, rtol=1e-5, atol=1e-5)


def test_a_decode_step_writes_into_the_buffer_it_already_has(model):
    """Within the headroom no step reallocates: the keys stay a view of one buffer."""
    cache = buffered_cache(model)
    ids = torch.randint(0, 512, (1, 100), generator=torch.Generator().manual_seed(2))
    _run(model, cache, ids, chunk=100, decode=1)
    layer = cache.layers[0]
    assert isinstance(layer, BufferLayer)
    buffer = layer.keys.data_ptr()
    capacity = headroom(100)  # the first update sized it: 100 + 256
    _run(model, cache, layer.keys.new_zeros((1, 1), dtype=torch.long), chunk=1, decode=100)
    assert cache.get_seq_length() == 100 + 1 + 1 + 100 < capacity
    assert layer.keys.data_ptr() == buffer  # the same storage: nothing was copied whole
    assert layer.keys.shape[-2] == cache.get_seq_length()


def test_growth_copies_what_is_held_and_keeps_headroom():
    layer = BufferLayer()
    k = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(1, 2, 3, 4)
    layer.update(k, -k)
    big = torch.ones(1, 2, 400, 4)
    keys, values = layer.update(big, -big)
    assert keys.shape[-2] == 403
    torch.testing.assert_close(keys[..., :3, :], k)
    torch.testing.assert_close(values[..., 3:, :], -big)
    assert headroom(403) == 403 + MIN_HEADROOM
    assert headroom(80_000) == 90_000  # an eighth of what it holds, past the minimum


def test_a_cropped_cache_decodes_as_one_that_never_went_further(model):
    """Speculative decoding crops rejected drafts (`cache.crop`); the next tokens are
    written over them and must read only what was kept."""
    ids = torch.randint(0, 512, (1, 120), generator=torch.Generator().manual_seed(3))
    cropped = buffered_cache(model)
    _run(model, cropped, ids, chunk=120, decode=0)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), cache=cropped, use_cache=True)
    cropped.crop(-4)
    assert cropped.get_seq_length() == 120
    straight = buffered_cache(model)
    _run(model, straight, ids, chunk=120, decode=0)
    tail = torch.tensor([[9, 10, 11]])
    with torch.inference_mode():
        a = model(input_ids=tail, cache=cropped, use_cache=True).logits
        b = model(input_ids=tail, cache=straight, use_cache=True).logits
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_snapshot_it_starts_from_is_copied_never_written(model):
    ids = torch.randint(0, 512, (1, 80), generator=torch.Generator().manual_seed(4))
    first = buffered_cache(model)
    _run(model, first, ids, chunk=80, decode=0)
    snapshot = [(k[:, :, :60].clone(), v[:, :, :60].clone()) for k, v, *_ in first]
    before = [(k.clone(), v.clone()) for k, v in snapshot]
    resumed = buffered_cache(model, snapshot)
    assert resumed.get_seq_length() == 60
    plain = DynamicCache(config=model.config)
    _run(model, plain, ids[:, :60], chunk=60, decode=0)
    a = _run(model, resumed, ids[:, 60:], chunk=20, decode=5)
    b = _run(model, plain, ids[:, 60:], chunk=20, decode=5)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for (k, v), (k0, v0) in zip(snapshot, before, strict=True):
        assert torch.equal(k, k0) and torch.equal(v, v0)
