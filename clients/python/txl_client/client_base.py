"""What `Client` and `AsyncClient` share: their options, and every method but closing, each an `Endpoint` over
one operation (operations.py)."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Generic, Self, TypeVar

import httpx

from . import operations
from .endpoints import Endpoint, GenerateEndpoint
from .options import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, Options
from .retries import Retries
from .transport import AsyncTransport, Transport

TransportT = TypeVar("TransportT", Transport, AsyncTransport)
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)


class ClientBase(ABC, Generic[TransportT, HttpT]):
    """A TXL Serve client. `url` defaults to $TXL_URL (else http://127.0.0.1:8000), `api_key` to $TXL_API_KEY.

    `timeout` is how long the client waits for the server to answer or to report progress: work that may take
    long (append, create with text, import, score, generate) is streamed, so a 1 MiB append takes as long as it
    takes, while a server that says nothing for `timeout` seconds raises TxlTimeoutError.

    Steps that change a session (create, append, generate, fork, import, delete) carry an Idempotency-Key, fresh
    per call and the same on its retries: transport failures are retried (up to `max_retries`) without ever
    stepping twice, and so are a proxy's 502, 503 and 504 (a replica that failed or is restarting). 429
    Overloaded is retried, honouring Retry-After, only with `retry_overloaded=True`; 409 Conflict (another step
    on the same session is running) only with `retry_conflicts=True` (or `with_options`). `retries` counts what
    was sent again, and each retry is logged (logger "txl_client"). Every request that works on a session carries
    its id in an `X-TXL-Session` header too (from the path, `session_id` or `previous_response_id`), for proxies
    that route by session.
    """

    transport: TransportT  # how this client sends; the clients with_options makes share its connections

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        retry_overloaded: bool = False,
        retry_conflicts: bool = False,
        http_client: HttpT | None = None,
    ) -> None:
        options = Options.resolve(
            url,
            api_key,
            timeout=timeout,
            max_retries=max_retries,
            retry_overloaded=retry_overloaded,
            retry_conflicts=retry_conflicts,
        )
        self.transport = self.open_transport(options, http_client)

    @abstractmethod
    def open_transport(self, options: Options, http_client: HttpT | None) -> TransportT:
        """The transport of a new client: over `http_client`, or its own connections (closed with it)."""

    @property
    def url(self) -> str:
        return self.transport.options.url

    @property
    def retries(self) -> Retries:
        """The requests this client (and those `with_options` made from it) sent again, by reason."""
        return self.transport.options.retries

    def with_options(
        self,
        *,
        timeout: float | None = None,
        max_retries: int | None = None,
        retry_overloaded: bool | None = None,
        retry_conflicts: bool | None = None,
    ) -> Self:
        """A client sharing this one's connections, with some options changed (for one call or a few)."""
        other = copy.copy(self)
        other.transport = self.transport.with_options(
            timeout=timeout,
            max_retries=max_retries,
            retry_overloaded=retry_overloaded,
            retry_conflicts=retry_conflicts,
        )
        return other

    # ------------------------------------------------------------------------------------------ methods

    # Sessions.
    create_session = Endpoint(operations.create_session)
    get_session = Endpoint(operations.get_session)
    list_sessions = Endpoint(operations.list_sessions)
    delete_session = Endpoint(operations.delete_session)

    # A session's steps and versions.
    append = Endpoint(operations.append)
    generate = GenerateEndpoint()
    versions = Endpoint(operations.versions)
    rewind = Endpoint(operations.rewind)
    fork_session = Endpoint(operations.fork_session)

    # Snapshots: a session's memory as a file, and a new session from one.
    export_snapshot = Endpoint(operations.export_snapshot)
    import_snapshot = Endpoint(operations.import_snapshot)

    # Stateless.
    score = Endpoint(operations.score)
    models = Endpoint(operations.models)
    health = Endpoint(operations.health)
    system = Endpoint(operations.system)
