"""Tracing through the OpenTelemetry SDK, configured by its standard environment variables.

Off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and
then sent over OTLP/HTTP (protobuf) in batches from the SDK's own thread. The SDK reads the rest itself:
`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (default:
every request, or as the caller's traceparent decided), `OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
`..._COMPRESSION`, `OTEL_BSP_*` (the batches), `OTEL_PROPAGATORS` (default: W3C trace context and baggage).
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off again.

Each app has its own provider (never the process-wide one), so that several apps can live in one process; off,
nothing of the SDK is even imported. The SDK is read from the environment when the app is made, not at import.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import __version__

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from ..settings import Settings

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
PROTOCOL = "http/protobuf"  # the one this server sends (the grpc exporter would bring grpcio along)
DEFAULT_SERVICE_NAME = "txl-serve"
# At shutdown, spans still queued get this long to leave (a collector that does not answer must not hold the
# process past its grace period).
FLUSH_SECONDS = 5.0


def _first(names: tuple[str, ...]) -> str:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return ""


def wanted() -> bool:
    """Whether the environment asks for traces: an OTLP endpoint, and the SDK and its exporter not turned off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(_first(ENDPOINTS))


def config_problem() -> str | None:
    """Why tracing cannot run as the environment asks (one line for the operator), or None."""
    if not wanted():
        return None
    protocol = _first(PROTOCOLS) or PROTOCOL
    if protocol != PROTOCOL:
        return (
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this server sends traces over {PROTOCOL} only (a "
            f"collector's OTLP/HTTP port, 4318 by default); set it to {PROTOCOL} or leave it unset"
        )
    exporters = [e.strip().lower() for e in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    if exporters != ["otlp"]:
        return f"OTEL_TRACES_EXPORTER={','.join(exporters)}: this server's exporter is otlp (or none, to turn it off)"
    return None


@dataclass(frozen=True)
class Tracing:
    """The app's tracer, and what its spans may say."""

    provider: TracerProvider
    tracer: Tracer
    model: str  # gen_ai.request.model
    text: bool  # spans may carry prompt and generated text (TXL_TRACE_TEXT, off by default)

    @classmethod
    def from_env(cls, settings: Settings, *, instance: str) -> Tracing | None:
        """The app's tracing (`instance`: this replica's name), or None when the environment does not ask for
        traces. Raises ValueError on a configuration it cannot honour (`config_problem`)."""
        if not wanted():
            return None
        if (problem := config_problem()) is not None:
            raise ValueError(problem)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {"service.version": __version__, "service.instance.id": instance}
        given = [
            p.partition("=")[0].strip() for p in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
        ]
        if (
            not os.environ.get("OTEL_SERVICE_NAME") and "service.name" not in given
        ):  # the environment's name wins over ours (Resource.create lets ours win)
            attributes["service.name"] = DEFAULT_SERVICE_NAME
        provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        tracer = provider.get_tracer("txl_server", __version__)
        return cls(provider, tracer, settings.served_model_id, settings.trace_text)

    async def close(self) -> None:
        """Sends the spans still queued (for at most FLUSH_SECONDS) and stops the exporter's thread."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self.provider.shutdown), FLUSH_SECONDS)
