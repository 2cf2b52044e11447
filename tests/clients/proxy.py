"""Tiny HTTP/1.1 proxies on loopback, in front of one server, that fail as a network or a gateway does.

`LoopbackProxy` relays each request to the server over a connection of its own and hands it to `relay`, which a
proxy overrides to fail its way. `DroppingProxy` loses responses: the request reaches the server and is handled in
full, then the connection is closed before the client sees a byte of the answer (a dropped connection at the worst
time); or it cuts the client off as soon as the request is through, while the server still works on it (`cut`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from typing import BinaryIO, Self

Message = tuple[bytes, dict[str, str], bytes]  # start line + headers, lower-cased headers, body


def read_message(stream: BinaryIO, *, response: bool) -> Message | None:
    """One HTTP message, or None at end of stream."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = stream.readline()
        if not line:
            return None
        head += line
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    status = int(head.split(b" ", 2)[1]) if response else 0
    if response and (status == 204 or status == 304 or 100 <= status < 200):
        return head, headers, b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size_line = stream.readline()
            body += size_line
            size = int(size_line.split(b";")[0], 16)
            chunk = stream.read(size + 2)
            body += chunk
            if size == 0:
                return head, headers, body
    length = int(headers.get("content-length", "0"))
    return head, headers, stream.read(length)


@dataclass
class Request:
    method: str
    path: str
    message: Message


class Exchange:
    """One client's connection, and the proxy's own connection to the server for it."""

    def __init__(self, client: socket.socket, target_port: int) -> None:
        self.client = client
        self.upstream = socket.create_connection(("127.0.0.1", target_port))
        self.from_client, self.from_server = client.makefile("rb"), self.upstream.makefile("rb")

    def send(self, request: Request) -> None:
        head, _, body = request.message
        self.upstream.sendall(head + body)

    def receive(self) -> Message | None:
        """The server's whole answer (None if it closed the connection)."""
        return read_message(self.from_server, response=True)

    def forward(self, request: Request) -> Message | None:
        self.send(request)
        return self.receive()

    def answer(self, data: bytes) -> None:
        self.client.sendall(data)

    def hang_up(self) -> None:
        """Closes the client's connection."""
        with contextlib.suppress(OSError):
            self.client.shutdown(socket.SHUT_RDWR)
        self.client.close()

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class LoopbackProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def relay(self, exchange: Exchange, request: Request) -> bool:
        """Handles one request; False closes the connection."""
        response = exchange.forward(request)
        if response is None:
            return False
        exchange.answer(response[0] + response[2])
        return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        exchange = Exchange(client, self.target_port)
        try:
            while (message := read_message(exchange.from_client, response=False)) is not None:
                method, path = message[0].decode("latin-1").split(" ", 2)[:2]
                if not self.relay(exchange, Request(method, path, message)):
                    return
        except (OSError, ValueError):
            return
        finally:
            exchange.close()

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    dropped: bool


class DroppingProxy(LoopbackProxy):
    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.seen: list[Seen] = []
        self._drops: dict[str, int] = {}
        self._cuts: dict[str, int] = {}

    def drop(self, path_part: str, times: int = 1) -> None:
        """Lose the responses of the next `times` requests whose path contains `path_part`."""
        with self._lock:
            self._drops[path_part] = self._drops.get(path_part, 0) + times

    def cut(self, path_part: str, times: int = 1) -> None:
        """Close the client's connection of the next `times` such requests once they are sent on; the server
        still sees its connection open, works the request out and answers (into the void)."""
        with self._lock:
            self._cuts[path_part] = self._cuts.get(path_part, 0) + times

    def requests_to(self, path_part: str) -> list[Seen]:
        return [s for s in self.seen if path_part in s.path]

    def relay(self, exchange: Exchange, request: Request) -> bool:
        cut = self._take(self._cuts, request.path)
        dropped = cut or self._take(self._drops, request.path)
        self.seen.append(Seen(request.method, request.path, request.message[1], dropped))
        exchange.send(request)
        if cut:
            exchange.hang_up()
        response = exchange.receive()  # the server finishes its work
        if response is None or dropped:
            return False  # ... and its answer is lost
        exchange.answer(response[0] + response[2])
        return True

    def _take(self, counts: dict[str, int], path: str) -> bool:
        with self._lock:
            for part, left in counts.items():
                if left > 0 and part in path:
                    counts[part] = left - 1
                    return True
        return False
