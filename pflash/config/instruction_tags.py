"""The tagged instruction blocks agent clients write into user and tool turns
(`instruction_tags`), and the check of their names."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

# found in Claude Code's and Codex CLI's requests (tests/fixtures/agent_clients), and the tool
# block PFlash writes itself for a template that cannot render tools (`compress.render.tool_prompt`)
DEFAULT_INSTRUCTION_TAGS = (
    "system-reminder",
    "environment_context",
    "user_instructions",
    "INSTRUCTIONS",
    "skills_instructions",
    "permissions instructions",
    "collaboration_mode",
    "context_window_reminder",
    "tools",
)
_TAG_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*( [A-Za-z0-9_.-]+)*$")


def _tag_names(tags: tuple[str, ...]) -> tuple[str, ...]:
    for tag in tags:
        if not (len(tag) <= 64 and _TAG_NAME.match(tag)):
            raise ValueError(
                f"instruction tag {tag!r} is not a tag name (letters, digits, _ . -, words "
                "separated by one space, at most 64 characters)"
            )
    return tags


InstructionTags = Annotated[tuple[str, ...], AfterValidator(_tag_names)]
