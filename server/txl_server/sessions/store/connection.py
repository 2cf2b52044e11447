"""The connection to Redis: one URL, a plain Redis or one watched by Sentinels, and never a command sent twice.

`TXL_REDIS_URL` is `redis://[:password@]host:port/db` (or `rediss://`, TLS), or, for a Redis that fails over,
`redis+sentinel://host:port[,host:port...]/master-name[/db]` (`rediss+sentinel://` for TLS): the Sentinels are
asked where the master is, and again whenever a connection fails, so the server follows a promoted replica by
itself. Passwords come from the environment (`TXL_REDIS_PASSWORD` for Redis, `TXL_REDIS_SENTINEL_PASSWORD` for
the Sentinels) rather than the URL, which is logged.

The client never retries a command by itself (redis-py's default retries a command that timed out): a change that
got no answer may have been applied, and sending it again could apply it twice. What happened is settled instead
(sessions/settling.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from redis import asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379
CONNECT_TIMEOUT_SECONDS = 2.0
HEALTH_CHECK_SECONDS = 10


class BadRedisUrl(ValueError):
    pass


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: list[tuple[str, int]]
    master: str
    db: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> SentinelUrl:
        parts = urlsplit(url)
        hosts = []
        for item in parts.netloc.rpartition("@")[2].split(","):
            host, colon, port = item.strip().rpartition(":")
            if not colon:
                host, port = item.strip(), ""
            if not host:
                raise BadRedisUrl(f"a Sentinel address without a host in {url!r}")
            try:
                hosts.append((host.strip("[]"), int(port) if port else SENTINEL_PORT))
            except ValueError as exc:
                raise BadRedisUrl(f"a Sentinel port is not a number in {url!r}") from exc
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise BadRedisUrl(f"no master name in {url!r} (redis+sentinel://host:port,.../master-name)")
        db = int(path[1]) if len(path) > 1 and path[1].isdigit() else 0
        return cls(hosts, path[0], db, parts.scheme.startswith("rediss"))


def is_sentinel(url: str) -> bool:
    return urlsplit(url).scheme in SENTINEL_SCHEMES


def connect(
    url: str,
    *,
    timeout: float,
    password: str | None = None,
    sentinel_password: str | None = None,
) -> aioredis.Redis:
    """A client for the Redis `url` names, each call answered within `timeout` seconds or failed."""
    no_retry = Retry(NoBackoff(), 0)
    connect_timeout = min(CONNECT_TIMEOUT_SECONDS, timeout)
    if not is_sentinel(url):
        extra = {"password": password} if password else {}
        return aioredis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=connect_timeout,
            health_check_interval=HEALTH_CHECK_SECONDS,
            retry=no_retry,
            **extra,
        )
    parsed = SentinelUrl.parse(url)
    sentinel_kwargs = {
        "socket_timeout": connect_timeout,
        "socket_connect_timeout": connect_timeout,
        "password": sentinel_password,
        "ssl": parsed.tls,
        "retry": no_retry,
    }
    sentinel = Sentinel(parsed.sentinels, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(
        parsed.master,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        health_check_interval=HEALTH_CHECK_SECONDS,
        retry=no_retry,
        password=password,
        db=parsed.db,
        ssl=parsed.tls,
    )
