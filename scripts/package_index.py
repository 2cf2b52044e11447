"""A local package index for building the image without PyPI or PyTorch's index from inside the build: torch and
every Python package the Dockerfile installs, as wheels, served on loopback in the layout pip reads (PEP 503).

    python scripts/package_index.py build DIR [--variant cuda]  # fills DIR/simple/ (pip download, this machine's
                                                                # pip configuration)
    python scripts/package_index.py serve DIR    # prints the index's URL, then serves DIR/simple/ until stopped

`build` asks pip for: torch at the Dockerfile's TORCH_VERSION, its CPU build (`==V+cpu`: a missing CPU wheel fails
here instead of downloading the CUDA build) or, with `--variant cuda`, its CUDA build (`==V,!=V+cpu`: PyPI's
Linux x86_64 wheel, with the CUDA libraries as wheels, about 3 GB); the project's and the client's dependencies
with the server extra, pinned by deploy/constraints.txt; and the build backend. pip finds them where this
machine's pip configuration says (PyPI, a mirror, or local wheels: `pip config list`); torch's CPU build also on
PyTorch's CPU index when it answers. Wheels only, for CPython 3.11 on this platform. A second `build` with the
same requirements does nothing.

scripts/docker_build.sh uses both when PyTorch's CPU index does not answer (or LOCAL_INDEX=1: where the build's
containers cannot use the network as this machine does, e.g. behind a proxy whose certificate only this machine
trusts); the image is then built with `--network host --build-arg TORCH_INDEX=URL --build-arg PIP_INDEX_URL=URL`.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pip evaluates environment markers for the Python it runs on, not for the image's: redis needs async-timeout on
# Python < 3.11.3, which Debian bookworm's 3.11.2 (the stand-in base) is.
FOR_OLDER_PYTHONS = ["async-timeout>=4.0.3"]


def torch_version() -> str:
    match = re.search(r"^ARG TORCH_VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert match, "the Dockerfile has no ARG TORCH_VERSION=..."
    return match.group(1)


def requirements() -> list[str]:
    """What the image's pip commands install besides the project's own wheels: the build backend, the
    project's dependencies with the server extra, and the client's dependencies."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    out = list(project["build-system"]["requires"])
    out += project["project"]["dependencies"] + project["project"]["optional-dependencies"]["server"]
    client = REPO / "clients" / "python" / "pyproject.toml"
    if client.is_file():
        out += tomllib.loads(client.read_text())["project"]["dependencies"]
    return [r for r in out if not re.match(r"torch\b", r)] + FOR_OLDER_PYTHONS


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):  # noqa: S310 (an https URL of our own)
            return True
    except OSError:
        return False


def build(directory: Path, variant: str) -> None:
    version = torch_version()
    torch = f"torch=={version}+cpu" if variant == "cpu" else f"torch=={version},!={version}+cpu"
    wanted = [torch, *requirements()]
    constraints = (REPO / "deploy" / "constraints.txt").read_text()
    stamp = hashlib.sha256("\n".join([*wanted, constraints]).encode()).hexdigest()
    simple = directory / "simple"
    if (directory / "stamp").is_file() and (directory / "stamp").read_text() == stamp:
        print(f"package index: {simple} is up to date", file=sys.stderr)
        return
    extra = (
        ["--extra-index-url", PYTORCH_CPU_INDEX]
        if variant == "cpu" and answers(PYTORCH_CPU_INDEX + "/")
        else []
    )
    with tempfile.TemporaryDirectory() as tmp:
        download = Path(tmp) / "wheels"
        constraint_file = Path(tmp) / "constraints.txt"
        constraint_file.write_text(constraints)
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(download),
            "--only-binary=:all:", "--python-version", "3.11", "--constraint", str(constraint_file),
            *extra, *wanted,
        ]  # fmt: skip
        print(
            f"package index: downloading {len(wanted)} requirements and their dependencies", file=sys.stderr
        )
        done = subprocess.run(command, capture_output=True, text=True)  # noqa: S603 (this interpreter's pip)
        if done.returncode != 0:
            sys.exit(
                f"package index: pip download failed:\n{done.stderr[-3000:]}\n"
                f"({torch}: the CPU build comes from {PYTORCH_CPU_INDEX} or a local wheel, pip's --find-links, "
                "e.g. PIP_FIND_LINKS=DIR; the CUDA build from PyPI)"
            )
        torches = [w.name for w in download.glob("torch-*.whl")]
        assert len(torches) == 1 and ("+cpu" in torches[0]) == (variant == "cpu"), torches
        if simple.exists():
            shutil.rmtree(simple)
        for wheel in sorted(download.glob("*.whl")):
            project = simple / canonical(wheel.name.split("-")[0])
            project.mkdir(parents=True, exist_ok=True)
            shutil.move(str(wheel), project / wheel.name)
    (directory / "stamp").write_text(stamp)
    print(f"package index: {len(list(simple.iterdir()))} projects in {simple}", file=sys.stderr)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(directory: Path, port: int) -> None:
    """Serves DIR/simple/ on loopback; its directory listings are the project pages pip reads."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"http://127.0.0.1:{server.server_address[1]}/simple", flush=True)
        server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["build", "serve"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--variant", choices=["cpu", "cuda"], default="cpu", help="build: which torch")
    parser.add_argument("--port", type=int, default=0, help="serve: the port (default: any free one)")
    args = parser.parse_args()
    if args.command == "build":
        args.directory.mkdir(parents=True, exist_ok=True)
        build(args.directory, args.variant)
    else:
        serve(args.directory, args.port)


if __name__ == "__main__":
    main()
