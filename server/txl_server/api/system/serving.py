"""What the system routes answer: readiness with what serves, the device report, and the metrics' gauges as they
stand."""

from __future__ import annotations

from ... import __version__
from ...errors import Unavailable
from ...metrics import Metrics
from ...runtime import Runtime
from ..shared.chat_template import ChatTemplateInfo
from ..shared.json_response import JSONResponse
from ..shared.serving_info import ServingInfo
from .protocol import AdmissionInfo, ReadyInfo, SystemInfo, WorkInfo


async def ready(runtime: Runtime) -> JSONResponse:
    reason = await runtime.not_ready()
    if reason is None:
        report = runtime.device_report()
        assert report is not None
        serving = ReadyInfo(
            device=report.device,
            dtype=report.dtype,
            attention=report.attention,
            cuda_graphs=report.cuda_graphs,
        )
        return JSONResponse({"status": "ready", "model": runtime.model_id, **serving.model_dump()})
    return JSONResponse(Unavailable(f"not ready: {reason}").body(), status_code=503)


def health(runtime: Runtime) -> dict[str, str]:
    reason = runtime.liveness()
    if reason is not None:
        raise Unavailable(f"not alive: {reason}; restart the server")
    return {"status": "ok"}


def system_info(runtime: Runtime, model_id: str, chat: ChatTemplateInfo | None) -> SystemInfo:
    report = runtime.device_report()
    if report is None:
        raise Unavailable("the server is starting")
    worker = runtime.worker
    work = None
    if worker is not None:
        work = WorkInfo(requests_running=worker.active_jobs, requests_waiting=worker.queued_jobs)
    return SystemInfo(
        model=model_id,
        version=__version__,
        serving=ServingInfo.of(report),
        admission=admission_info(runtime),
        chat_template=chat,
        work=work,
    )


def admission_info(runtime: Runtime) -> AdmissionInfo | None:
    gate = runtime.worker.gate if runtime.worker is not None else None
    if gate is None:
        return None
    settings = runtime.settings
    return AdmissionInfo(
        ttft_target_seconds=gate.targets.ttft,
        tbt_target_seconds=gate.targets.tbt,
        measured=gate.targets.measured,
        row_cap=gate.scheduler.cap,
        estimate_factor=gate.policy.factor,
        max_concurrent_requests=settings.max_concurrent_requests,
        max_concurrent_requests_per_tenant=settings.max_concurrent_requests_per_tenant,
    )


def update_gauges(metrics: Metrics, runtime: Runtime) -> None:
    """The sessions and memory each tier holds, and its budget, as they are now."""
    service = runtime.service
    if service is not None:
        for tier in ("device", "host"):
            metrics.sessions.labels(tier).set(service.cache.count(tier))
            metrics.memory_bytes.labels(tier).set(service.cache.used(tier))
            metrics.memory_budget.labels(tier).set(service.cache.budget(tier))
