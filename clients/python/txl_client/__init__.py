"""txl_client: the Python SDK for TXL Serve (stateful Transformer-XL inference), sync and async.

    from txl_client import Client, NotFound
    client = Client()                                    # $TXL_URL and $TXL_API_KEY, or arguments
    session = client.create_session(text="Hello")
    result = client.generate(session.id, max_tokens=16, temperature=0)
    for token in client.generate(session.id, max_tokens=16, stream=True):
        print(token.text, end="")

See docs/clients.md for the full tour (streaming, errors, retries, the `txl` command line).
"""

from ._version import __version__
from .async_client import AsyncClient
from .client import Client
from .conversations import AsyncConversations, Conversations
from .errors import (
    Conflict,
    Gone,
    IdempotencyKeyReused,
    InternalError,
    InvalidRequest,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    TxlConnectionError,
    TxlError,
    TxlTimeoutError,
    Unauthorized,
    Unavailable,
    VersionNotFound,
)
from .memories import AsyncMemories, Memories
from .streams import AsyncGenerateStream, GenerateStream
from .types import (
    AppendResult,
    Conversation,
    ConversationItem,
    GenerateResult,
    Health,
    Memory,
    ModelCard,
    Progress,
    Reply,
    ScoreProgress,
    ScoreResult,
    Session,
    SessionVersion,
    SystemInfo,
    TokenEvent,
    Usage,
    Work,
)

__all__ = [
    "AppendResult",
    "AsyncClient",
    "AsyncConversations",
    "AsyncGenerateStream",
    "AsyncMemories",
    "Client",
    "Conflict",
    "Conversation",
    "ConversationItem",
    "Conversations",
    "GenerateResult",
    "GenerateStream",
    "Gone",
    "Health",
    "IdempotencyKeyReused",
    "InternalError",
    "InvalidRequest",
    "Memories",
    "Memory",
    "ModelCard",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "Progress",
    "Reply",
    "ScoreProgress",
    "ScoreResult",
    "Session",
    "SessionVersion",
    "SystemInfo",
    "TokenEvent",
    "TxlConnectionError",
    "TxlError",
    "TxlTimeoutError",
    "Unauthorized",
    "Unavailable",
    "Usage",
    "VersionNotFound",
    "Work",
    "__version__",
]
