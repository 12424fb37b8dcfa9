"""OpenAI's stream framing (chat completions, completions): the answer path yields items,
the edge frames them: chunks as `data:` events, keep-alives as they are, an error in-band,
then `[DONE]`."""

from __future__ import annotations

import asyncio
import json

from pflash.serving.chat_completion.serving import chat_chunk
from pflash.serving.envelope import (
    SSE_DONE,
    SSE_KEEPALIVE,
    StreamError,
    error_response,
    openai_frames,
)
from pflash.serving.protocol import ResponseMeta

META = ResponseMeta("chatcmpl-00ff", "pflash", 1_700_000_000)


def _frames(*items) -> list[str]:
    async def source():
        for item in items:
            yield item

    async def collect():
        return [frame async for frame in openai_frames(source())]

    return asyncio.run(collect())


def test_a_chat_stream_frames_chunks_and_ends_with_done():
    frames = _frames(SSE_KEEPALIVE, chat_chunk(META, role="assistant", content="Hi"))
    assert frames[0] == SSE_KEEPALIVE and frames[-1] == SSE_DONE
    chunk = json.loads(frames[1].removeprefix("data: "))
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}


def test_a_failure_is_reported_in_band_then_done_and_nothing_after():
    status, body = error_response(TimeoutError())
    frames = _frames(
        chat_chunk(META, content="a"), StreamError(status, body), chat_chunk(META, content="b")
    )
    assert len(frames) == 3 and frames[-1] == SSE_DONE
    assert json.loads(frames[1].removeprefix("data: ")) == body
