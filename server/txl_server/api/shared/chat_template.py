"""The chat template (TXL_CHAT_TEMPLATE): messages written out as one text for a base language model to continue,
and the stop string where the user's next turn would begin. Chat completions and the Responses API both use it.

TXL Serve serves base language models: to them a chat is text to continue. With a template (e.g. `transcript`)
the messages are written out one after another (`User: Hi\\n`), the model continues the transcript after the
assistant's prefix (`Assistant:`), and the reply ends where the model begins the user's next turn (`\\nUser:`).

The template in force is chosen once, when the app is made (`served_settings`): the operator's TXL_CHAT_TEMPLATE,
else the one the model directory declares in its `chat_template.json` (`{"format": "{Role}: {content}\\n"}`, as
Hugging Face models carry theirs in their tokenizer config), unless the operator set it to "none".
"""

from __future__ import annotations

import json
import logging
import string
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...errors import InvalidRequest
from ...settings import NO_CHAT_TEMPLATE, Settings, chat_format

log = logging.getLogger(__name__)

# The file of a model directory that declares its chat template: {"format": <a TXL_CHAT_TEMPLATE value>}.
TEMPLATE_FILE = "chat_template.json"

# The roles of a chat's messages (OpenAI's, but for tools, which this server has none of).
Role = Literal["system", "developer", "user", "assistant"]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # Other kinds of content (images, audio) are refused with their reason (`ChatMessage.text`).
    type: str = Field(..., max_length=64, json_schema_extra={"enum": ["text"]})
    text: str = ""


class ChatMessage(BaseModel):
    """A message as OpenAI's chat completions take it: its role, and its content, which OpenAI requires of every
    message but an assistant's tool calls (none here)."""

    model_config = ConfigDict(extra="ignore")
    role: Role
    content: str | list[ContentPart]

    def text(self, index: int) -> str:
        if isinstance(self.content, str):
            return self.content
        if any(part.type != "text" for part in self.content):
            raise InvalidRequest("only text content is supported", param=f"messages.{index}.content")
        return "".join(part.text for part in self.content)


class ChatTemplate:
    """Messages -> one prompt, and the stop string that ends the assistant's turn."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.prefix, self.suffix = template.split("{content}")

    def prompt(self, messages: list[ChatMessage], *, generation_prompt: bool = True) -> str:
        """The messages written out, then (with `generation_prompt`) the assistant's prefix the model continues."""
        turns = [
            self.template.format(role=m.role, Role=m.role.capitalize(), content=m.text(i))
            for i, m in enumerate(messages)
        ]
        return "".join(turns) + (self.generation_prompt() if generation_prompt else "")

    def generation_prompt(self) -> str:
        return self.prefix.format(role="assistant", Role="Assistant").rstrip()

    def jinja(self) -> str:
        """The same template in Jinja, as HF's `apply_chat_template` (and vLLM's `/tokenizer_info`) give it: a
        message's text is its string content, or its text parts joined."""
        pieces = []
        for literal, field, _, _ in string.Formatter().parse(self.template):
            if literal:
                pieces.append("{{ " + json.dumps(literal) + " }}")
            if field == "role":
                pieces.append("{{ message['role'] }}")
            elif field == "Role":
                pieces.append("{{ message['role'] | capitalize }}")
            elif field == "content":
                pieces.append(
                    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
                    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
                )
        return (
            "{% for message in messages %}" + "".join(pieces) + "{% endfor %}"
            "{% if add_generation_prompt %}{{ " + json.dumps(self.generation_prompt()) + " }}{% endif %}"
        )

    def stop(self) -> str | None:
        """Where the user's next turn would begin: the end of a message and the start of the user's."""
        stop = self.suffix + self.prefix.format(role="user", Role="User").rstrip()
        return stop if stop.strip() else None


class ChatTemplateInfo(BaseModel):
    """Which chat template is in force (`/v1/models`, `/v1/system`)."""

    format: str = Field(..., description="Each message written out: {Role} (capitalised), {role}, {content}")
    source: Literal["model", "TXL_CHAT_TEMPLATE"] = Field(
        ...,
        description="model: the model directory's own (chat_template.json); TXL_CHAT_TEMPLATE: the operator's",
    )

    @classmethod
    def of(cls, settings: Settings) -> ChatTemplateInfo | None:
        if settings.chat_template is None or settings.chat_template_source is None:
            return None
        return cls.model_validate({"format": settings.chat_template, "source": settings.chat_template_source})


def declared_chat_template(model_dir: Path) -> str | None:
    """The chat template `model_dir` declares in its `chat_template.json`, checked as TXL_CHAT_TEMPLATE is; None
    where it declares none, or only a Jinja template (Hugging Face's), which this server does not render. A file
    that declares one badly stops the start, naming the file."""
    path = model_dir / TEMPLATE_FILE
    if not path.is_file():
        return None
    try:
        declared = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a JSON file: {exc}") from exc
    if not isinstance(declared, dict) or not isinstance(declared.get("format", ""), str):
        raise ValueError(f'{path} must be a JSON object with a string "format"')
    if "format" not in declared:
        log.warning(
            '%s holds no TXL chat template ("format"), maybe a Jinja one, which this server does not render: '
            "set TXL_CHAT_TEMPLATE to serve chat",
            path,
        )
        return None
    try:
        return chat_format(declared["format"])
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def served_settings(settings: Settings) -> Settings:
    """`settings` with the chat template in force (see the module's docstring)."""
    operator = settings.chat_template
    declared = declared_chat_template(settings.model_dir) if operator is None else None
    served = settings.with_model_chat_template(declared)
    if served.chat_template is not None:
        log.info("chat template (%s): %r", served.chat_template_source, served.chat_template)
    elif operator == NO_CHAT_TEMPLATE:
        log.info("no chat template (TXL_CHAT_TEMPLATE=none): chat answers 404")
    return served
