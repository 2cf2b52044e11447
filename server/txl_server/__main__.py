"""`python -m txl_server [--host H] [--port P] [--model DIR]`: the server, configured by flags and TXL_* variables.

`python -m txl_server check [...]`: checks the configured model on the configured device instead (txl_server.check).
`python -m txl_server store migrate|sweep|status`: the block store, by hand (txl_server.sessions.blocks.command).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

log = logging.getLogger("txl_server")


def parse_args(argv: list[str] | None = None, prog: str = "python -m txl_server") -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Stateful Transformer-XL inference server. Every setting can also come from a TXL_* "
        "environment variable (e.g. TXL_PORT, TXL_REDIS_URL, TXL_API_KEYS); flags win.",
        epilog="Sessions survive restarts: every step is saved to Redis (TXL_PERSISTENCE=always; evict and none "
        "keep memory in the process), and the server says at start-up and at shutdown where they are kept. "
        "Ctrl-C or SIGTERM stops taking requests and lets running ones finish for TXL_SHUTDOWN_GRACE_SECONDS "
        "(20); a second Ctrl-C stops them at once.",
    )
    parser.add_argument("--host", help="interface to listen on (TXL_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (TXL_PORT, default 8000)")
    parser.add_argument("--model", type=Path, help="model directory (TXL_MODEL, default: the bundled model)")
    parser.add_argument("--redis-url", help="Redis URL (TXL_REDIS_URL, default: a private redis-server)")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="weights dtype (TXL_DTYPE)"
    )
    parser.add_argument(
        "--device",
        help="torch device (TXL_DEVICE): cpu, the default even where a GPU is; cuda or cuda:N for an NVIDIA GPU "
        "(needs torch's CUDA build, which scripts/install.sh installs where it finds one: docs/server.md)",
    )
    parser.add_argument("--log-level", default=None, help="debug, info, warning (TXL_LOG_LEVEL)")
    parser.add_argument(
        "--ephemeral",
        action="store_true",
        default=None,
        help="throw-away sessions: the private Redis in a temporary directory deleted at shutdown (TXL_EPHEMERAL=1). "
        "By default sessions are kept, and survive restarts, in ~/.local/share/txl-serve/redis/MODEL "
        "($XDG_DATA_HOME/txl-serve/... if set; TXL_REDIS_DATA_DIR to choose), or in the Redis of TXL_REDIS_URL",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = "python -m txl_server") -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check"]:
        from .check.command import main as check

        return check(argv[1:])
    if argv[:1] == ["store"]:
        from .sessions.blocks.command import main as store

        return store(argv[1:])
    args = parse_args(argv, prog)
    from .settings import Settings

    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"invalid settings: {one_line(exc)}", file=sys.stderr)
        return 2
    from .telemetry.logs import configure_logging
    from .telemetry.tracing import config_problem

    configure_logging(settings.log_format, settings.log_level)
    if (problem := config_problem()) is not None:  # the OTEL_* variables ask for traces it cannot send
        print(f"cannot trace: {problem}", file=sys.stderr)
        return 2
    if not settings.model_dir.is_dir():
        print(f"model directory not found: {settings.model_dir}", file=sys.stderr)
        return 2
    from .serving import PortUnavailable, bind_sockets

    try:  # first: a port in use is known in a millisecond, before torch is even imported
        sockets = bind_sockets(settings.host, settings.port)
    except PortUnavailable as exc:
        print(f"{exc} (another server?): stop it or choose another --port (TXL_PORT)", file=sys.stderr)
        return 2
    if settings.redis_url is None and (data_dir := settings.private_redis_dir()) is not None:
        from .sessions.redis_server import DataDirInUse, lock_data_dir

        try:  # before loading too: two servers on one directory would corrupt it (the runtime locks it again)
            lock_data_dir(data_dir).close()
        except DataDirInUse as exc:
            for sock in sockets:
                sock.close()
            print(exc, file=sys.stderr)
            return 2
    try:
        return _serve(settings, sockets)
    except KeyboardInterrupt:  # Ctrl-C while loading, before the server handles signals itself
        print("stopped before the server started", file=sys.stderr)
        return 130
    finally:
        for sock in sockets:
            sock.close()


def _serve(settings: Any, sockets: list[Any]) -> int:
    from .device_check import DeviceUnavailable, check_device
    from .runtime import UnsupportedDtype, check_dtype, load_model
    from .serving import warn_if_open
    from .session_stores import EvictingRedis, check_redis
    from .sessions.blocks.identity import ForeignBlockStore

    try:  # before loading: a GPU that is not there is named as such, not as a model that cannot load
        check_device(settings.device, settings.dtype)
    except DeviceUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    try:  # before loading: a dtype this CPU cannot run is the settings' fault, not the model's
        check_dtype(settings)
    except UnsupportedDtype as exc:
        print(f"cannot serve --dtype {settings.dtype}: {exc}", file=sys.stderr)
        return 2
    try:  # before loading: a Redis that would delete sessions is the settings' fault too
        check_redis(settings)
    except EvictingRedis as exc:
        print(f"cannot keep sessions in this Redis: {exc}", file=sys.stderr)
        return 2
    except ForeignBlockStore as exc:
        print(f"cannot continue this Redis's sessions: {exc}", file=sys.stderr)
        return 2
    # After the checks that stop start-up in one line, before the minutes of loading.
    warn_if_open(sockets, has_api_keys=settings.has_api_keys)
    log.info("loading the model in %s (%s on %s)", settings.model_dir, settings.dtype, settings.device)
    try:  # fail fast, in one line, on an unreadable model (the lifespan would print a traceback)
        loaded = load_model(settings)
    except Exception as exc:
        print(f"cannot load the model in {settings.model_dir}: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .api.app import create_app
    from .serving import TxlServer, head_deadline
    from .telemetry.logs import log_config

    config = uvicorn.Config(
        create_app(settings, loaded=loaded),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=log_config(settings.log_format, settings.log_level),
        # The app drains itself first (TXL_SHUTDOWN_GRACE_SECONDS); what uvicorn still waits for after that is
        # a response being written.
        timeout_graceful_shutdown=5,
        http=head_deadline(settings.header_timeout_seconds),
    )
    server = TxlServer(
        config, ready_message=ready_message(settings.host, settings.port), exit_process=exit_now
    )
    server.run(sockets=sockets)
    # uvicorn returns normally when startup failed (e.g. an unreadable checkpoint): report it as a failure.
    return 0 if server.started else 1


def one_line(error: ValidationError) -> str:
    """pydantic's errors as one line: `field: message; ...`."""
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc']) or 'settings'}: {e['msg'].removeprefix('Value error, ')}"
        for e in error.errors()
    )


def ready_message(host: str, port: int) -> str:
    """Where to go once the server answers. A wildcard address is shown as loopback, which reaches it from this
    machine (`--host 0.0.0.0` in a container)."""
    from .healthcheck import local_url

    base = local_url(host, port)
    return f"ready: the playground is at {base}/ and the API docs at {base}/docs"


def exit_now(code: int) -> None:
    """Ends the process once everything has stopped: the interpreter's own teardown would then spend seconds
    in the garbage collector walking torch's and triton's objects (5-7 s on a 2-core machine), with nothing
    left to close, which makes a Ctrl-C or a restart wait for nothing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
