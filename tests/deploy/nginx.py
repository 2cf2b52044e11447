"""deploy/nginx as nginx reads it, for the tests: the session maps (parsed and evaluated the way nginx's `map`
does), the upstream rendered for a given set of replicas, and a real nginx process running the shipped
configuration on loopback.

Small on purpose: it covers the forms deploy/nginx uses and fails loudly on anything else.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers.servers import wait_until_started

from .files import DEPLOY

NGINX_DIR = DEPLOY / "nginx"
SESSION_MAP = NGINX_DIR / "session-map.conf"
UPSTREAM = NGINX_DIR / "upstream.conf"
PROXY = NGINX_DIR / "txl-proxy.conf"
MAIN = NGINX_DIR / "nginx.conf"


def nginx_binary() -> str | None:
    """Debian's nginx (`apt-get install nginx`, as .ci/run does)."""
    found = shutil.which("nginx")
    if found:
        return found
    return "/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else None


def strip_comments(text: str) -> list[str]:
    """The configuration's lines without comments and blank lines, each stripped (nginx ignores both). A `#`
    inside quotes is text."""
    lines = []
    for raw in text.splitlines():
        quote = None
        for i, c in enumerate(raw):
            if quote:
                quote = None if c == quote else quote
            elif c in "'\"":
                quote = c
            elif c == "#":
                raw = raw[:i]
                break
        if raw.strip():
            lines.append(raw.strip())
    return lines


# ---------------------------------------------------------------------------------------------- maps


@dataclass
class NginxMap:
    source: str  # the variable mapped from, e.g. "uri" for $uri
    rules: list[tuple[re.Pattern[str], str]]  # "~regex" value, in order: nginx takes the first that matches
    default: str


_MAP = re.compile(r"map \$(\w+) \$(\w+) \{")
_RULE = re.compile(r'"~([^"]+)"\s+(\$?\w+);')
_DEFAULT = re.compile(r"default\s+(\$?\w+);")


def parse_maps(text: str) -> dict[str, NginxMap]:
    """{variable: map} of every `map` block; regex rules and a default only (what deploy/nginx uses)."""
    maps: dict[str, NginxMap] = {}
    lines = iter(strip_comments(text))
    for line in lines:
        start = _MAP.fullmatch(line)
        if start is None:
            continue
        source, variable = start.groups()
        rules, default = [], None
        for inside in lines:
            if inside == "}":
                break
            if rule := _RULE.fullmatch(inside):
                rules.append((re.compile(rule.group(1)), rule.group(2)))
            elif match := _DEFAULT.fullmatch(inside):
                default = match.group(1)
            else:
                raise AssertionError(f"map ${variable}: a line this reader does not know: {inside!r}")
        assert default is not None, f"map ${variable} has no default"
        maps[variable] = NginxMap(source, rules, default)
    return maps


def evaluate(maps: dict[str, NginxMap], variable: str, request: dict[str, str]) -> str:
    """The value nginx gives `$variable` for a request whose variables are `request` (e.g. uri, request_id,
    http_x_txl_session; a missing header is empty). PCRE and Python agree on the expressions used here."""

    def value(text: str, groups: tuple[str, ...]) -> str:
        if text.startswith("$"):
            name = text[1:]
            if name.isdigit():
                return groups[int(name) - 1]
            return evaluate(maps, name, request)
        return text

    if variable not in maps:
        return request.get(variable, "")
    table = maps[variable]
    subject = evaluate(maps, table.source, request)
    for pattern, result in table.rules:
        if m := pattern.search(subject):
            return value(result, m.groups())
    return value(table.default, ())


# ---------------------------------------------------------------------------------------------- upstream

_SERVER = re.compile(r"(\s*)server\s+\S+((?:\s+\S+)*);\s*")


def render_upstream(addresses: list[str], text: str | None = None) -> str:
    """deploy/nginx/upstream.conf with its `server` lines replaced by one per address, with the same
    parameters (the shipped lines all have the same ones), where the first one was."""
    lines = (UPSTREAM.read_text() if text is None else text).splitlines()
    servers = [m for line in lines if (m := _SERVER.fullmatch(line))]
    assert servers, "upstream.conf has no server line"
    assert len({m.group(2) for m in servers}) == 1, "the server lines differ in their parameters"
    indent, params = servers[0].group(1), servers[0].group(2)
    out: list[str] = []
    for line in lines:
        if not _SERVER.fullmatch(line):
            out.append(line)
        elif line == servers[0].string:
            out += [f"{indent}server {address}{params};" for address in addresses]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------- a running nginx


class Nginx:
    """nginx on 127.0.0.1:port with the shipped session maps and proxy, and an upstream of `addresses`.

    The main file is the test's own only for what a test machine needs (its port, its pid, logs and temp
    directories, one worker): the maps, the upstream's hashing and health parameters and everything the proxy
    does come from deploy/nginx, as nginx.conf includes them."""

    def __init__(self, workdir: Path, addresses: list[str], port: int) -> None:
        binary = nginx_binary()
        assert binary is not None, "nginx is not installed"
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.conf = workdir / "nginx.conf"
        self.upstream = workdir / "upstream.conf"
        self.error_log = workdir / "error.log"
        self.access_log = workdir / "access.log"
        self.process: subprocess.Popen[bytes] | None = None
        for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (workdir / name).mkdir(parents=True, exist_ok=True)
        self.set_upstream(addresses)
        self.conf.write_text(self._main())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _main(self) -> str:
        w = self.workdir
        return f"""
worker_processes 1;
pid {w}/nginx.pid;
error_log {self.error_log} notice;
events {{ worker_connections 512; }}
http {{
    client_body_temp_path {w}/body;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    include {SESSION_MAP};
    include {self.upstream};
    log_format txl '"$request" $status replica=$upstream_http_x_txl_replica upstream=$upstream_addr '
                   'upstream_status=$upstream_status';
    access_log {self.access_log} txl;
    server {{
        listen 127.0.0.1:{self.port};
        include {PROXY};
    }}
}}
"""

    def set_upstream(self, addresses: list[str]) -> None:
        self.upstream.write_text(render_upstream(addresses))

    def start(self, timeout: float = 20) -> Nginx:
        self.process = subprocess.Popen(
            [self.binary, "-p", self.workdir, "-c", self.conf, "-e", self.error_log, "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until_started(self._answers, self._exited, timeout=timeout, interval=0.05)
        except RuntimeError as exc:
            raise RuntimeError(f"nginx: {exc}:\n{self.log()}") from None
        return self

    def _answers(self) -> bool:
        try:
            httpx.get(self.url + "/", timeout=1)
            return True
        except httpx.TransportError:
            return False

    def _exited(self) -> str | None:
        assert self.process is not None
        return None if self.process.poll() is None else "exited at start"

    def reload(self, addresses: list[str], timeout: float = 20) -> None:
        """A new upstream, as an operator reloads one: SIGHUP to the master, which starts a worker on the new
        configuration and lets the old one finish its requests. Returns once the old worker is gone."""
        assert self.process is not None
        self.set_upstream(addresses)
        before = self.log().count("exited with code")
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count("exited with code") > before:
                return
            time.sleep(0.05)
        raise RuntimeError(f"nginx did not reload:\n{self.log()}")

    def log(self) -> str:
        return self.error_log.read_text(errors="replace") if self.error_log.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: let open responses end
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
