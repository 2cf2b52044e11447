"""`python -m txl_server.healthcheck [--path /health]`: the image's HEALTHCHECK. Exit 0 when the server answers 200.

The probe runs beside the server (`docker exec`, Docker's health check), not inside it, so it finds where the
server listens as the server did: the `--host`/`--port` flags of the `python -m txl_server` process (read from
/proc: in a container, the only one), else TXL_HOST/TXL_PORT, else the defaults; the probe's own `--host`/`--port`
skip the search. `docker run IMAGE --port 9000` then turns healthy too, where a
probe fixed on port 8000 stayed unhealthy for ever. A wildcard address (`0.0.0.0`, `::`) is probed on loopback.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .settings import Settings

PROC = Path("/proc")


def server_flags(proc: Path = PROC) -> list[str]:
    """The arguments after `-m txl_server` of the first server process found (lowest pid), or [] if none."""
    pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())
    for pid in pids:
        try:
            argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        words = [w.decode(errors="replace") for w in argv if w]
        for i in range(len(words) - 1):
            if words[i] == "-m" and words[i + 1] == "txl_server":
                rest = words[i + 2 :]
                return [] if rest[:1] == ["check"] else rest
    return []


def server_address(flags: list[str]) -> tuple[str, int]:
    """(host, port) the server with these flags listens on: flags win over TXL_HOST/TXL_PORT, as in the server."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    known, _ = parser.parse_known_args(flags)
    settings = Settings(**{k: v for k, v in vars(known).items() if v is not None})
    return settings.host, settings.port


def local_url(host: str, port: int, path: str = "") -> str:
    """The URL that reaches a server listening on host:port from this machine: a wildcard address (`--host
    0.0.0.0` in a container) is reached on loopback."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name
        return f"http://{host}:{port}{path}"
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{shown}:{port}{path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m txl_server.healthcheck", description=__doc__)
    parser.add_argument(
        "--path", default="/health", help="/health (alive: the device works, the worker progresses) or /ready"
    )
    parser.add_argument("--timeout", type=float, default=4.0)
    parser.add_argument("--host", help="the server's --host (default: found as described above)")
    parser.add_argument("--port", type=int, help="the server's --port (default: found as described above)")
    args = parser.parse_args(argv)
    given = [f"--{name}={value}" for name in ("host", "port") if (value := getattr(args, name)) is not None]
    url = local_url(*server_address(given or server_flags()), args.path)
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310 (http on loopback)
            print(f"{url}: {response.status}")
            return 0
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
