"""A turn's input: the text it feeds (a string input continued verbatim, or messages written out with the chat
template, as chat completions are) and the input items it lists."""

from __future__ import annotations

from typing import Any, Protocol

from ...errors import InvalidRequest
from ..shared.chat_template import ChatMessage, ChatTemplate
from .protocol import InputMessageItem, ResponseCreateRequest


class TurnEnding(Protocol):
    """How the text before a turn ended: a turn of messages or not, and whether at the template's turn end."""

    @property
    def messages(self) -> bool: ...

    @property
    def turn_end(self) -> bool: ...


def turn_text(
    body: ResponseCreateRequest,
    template: ChatTemplate | None,
    previous: TurnEnding | None,
    before: list[ChatMessage] | None = None,
) -> tuple[str, list[ChatMessage] | None]:
    """What the turn feeds, and its messages (None for a string input).

    A string is fed verbatim after the instructions, as a continuation. Messages are written out with the chat
    template after the instructions (as a system message), up to the assistant's prefix. After a turn of
    messages, the memory ends inside the conversation: where the model began the user's next turn (its prefix is
    then not written again), or inside its own reply, cut at max_output_tokens (which is then closed).

    `before`: messages to write before the input's (a conversation's items added by hand since its last turn,
    with which a string input is one user message, as OpenAI takes it)."""
    if isinstance(body.input, str) and not before:
        return (body.instructions or "") + body.input, None
    if template is None:
        raise InvalidRequest(
            "message input needs a chat template, and this server has none: the operator sets "
            "TXL_CHAT_TEMPLATE (e.g. transcript); or send input as a string, which the model continues",
            param="input",
        )
    given = (
        body.messages() if isinstance(body.input, list) else [ChatMessage(role="user", content=body.input)]
    )
    messages = [*(before or []), *given]
    if body.instructions is not None:
        messages.insert(0, ChatMessage(role="system", content=body.instructions))
    text = template.prompt(messages)
    if previous is None or not previous.messages:
        return text, messages
    if not previous.turn_end:
        return template.suffix.format(role="assistant", Role="Assistant") + text, messages
    user = template.template.format(role="user", Role="User", content="")  # an empty user message
    written = template.prefix.format(role="user", Role="User").rstrip()  # what the model wrote of it
    if messages[0].role != "user":  # the user's turn the model began is closed, empty
        text = user + text
    return text[len(written) :], messages


def input_items(
    body: ResponseCreateRequest, messages: list[ChatMessage] | None, before: int = 0
) -> list[dict[str, Any]]:
    """The turn's input as OpenAI lists it: a string is one user message (instructions are not items, nor the
    `before` messages written before the input's)."""
    if messages is None:
        assert isinstance(body.input, str)
        return [InputMessageItem.of("user", body.input).model_dump(exclude_none=True)]
    given = messages[(1 if body.instructions is not None else 0) + before :]
    return [InputMessageItem.of(m.role, m.text(i)).model_dump(exclude_none=True) for i, m in enumerate(given)]
