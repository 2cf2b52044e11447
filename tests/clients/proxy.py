"""A tiny HTTP/1.1 proxy on loopback that can lose responses: the request reaches the server and is handled in full,
then the connection is closed before the client sees a byte of the answer (a dropped connection at the worst time).
Or it cuts the client off as soon as the request is through, while the server still works on it (`cut`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    dropped: bool


def _read_message(stream, *, response: bool) -> tuple[bytes, dict[str, str], bytes] | None:
    """(start line + headers, lower-cased headers, body) of one HTTP message, or None at end of stream."""
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


class DroppingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen: list[Seen] = []
        self._drops: dict[str, int] = {}
        self._cuts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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

    def _should_drop(self, path: str) -> bool:
        return self._take(self._drops, path)

    def _take(self, counts: dict[str, int], path: str) -> bool:
        with self._lock:
            for part, left in counts.items():
                if left > 0 and part in path:
                    counts[part] = left - 1
                    return True
        return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        from_client, from_server = client.makefile("rb"), upstream.makefile("rb")
        try:
            while True:
                request = _read_message(from_client, response=False)
                if request is None:
                    return
                head, headers, body = request
                method, path = head.decode("latin-1").split(" ", 2)[:2]
                cut = self._take(self._cuts, path)
                dropped = cut or self._should_drop(path)
                self.seen.append(Seen(method, path, headers, dropped))
                upstream.sendall(head + body)
                if cut:
                    with contextlib.suppress(OSError):
                        client.shutdown(socket.SHUT_RDWR)
                    client.close()
                response = _read_message(from_server, response=True)  # the server finishes its work
                if response is None or dropped:
                    return  # ... and its answer is lost
                client.sendall(response[0] + response[2])
        except (OSError, ValueError):
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def __enter__(self) -> DroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
