"""scripts/install.sh: its pip wrapper keeps setuptools' "Editable installation" warning blocks out of the log.

The script is sourced, which only defines its functions, and its `pip_quietly` runs an editable install of a
small package into a fresh virtual environment, next to the same install without it (which must show the block,
or this test proves nothing on this setuptools).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WARNING = "Editable installation"


@pytest.fixture(scope="module")
def venv_and_package(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("install")
    package = root / "demo"
    (package / "demo").mkdir(parents=True)
    (package / "demo" / "__init__.py").write_text("ANSWER = 42\n")
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "demo"\nversion = "0.1"\n'
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # As install.sh does first: the pip a venv starts with hides the build backend's output anyway.
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, capture_output=True, timeout=300)
    return venv, package


def editable_install(venv: Path, package: Path, wrapper: str) -> subprocess.CompletedProcess[str]:
    script = (
        f'source scripts/install.sh && {wrapper} "$VENV/bin/python" -m pip install --quiet '
        '--disable-pip-version-check -e "$PACKAGE"'
    )
    env = {**os.environ, "VENV": str(venv), "PACKAGE": str(package)}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_pip_quietly_keeps_the_editable_installation_warnings_out(venv_and_package):
    venv, package = venv_and_package
    plain = editable_install(venv, package, wrapper="")
    assert plain.returncode == 0, plain.stderr
    assert WARNING in plain.stderr, "setuptools no longer warns: nothing left to filter"

    quiet = editable_install(venv, package, wrapper="pip_quietly")
    assert quiet.returncode == 0, quiet.stderr
    assert WARNING not in quiet.stderr and "!!" not in quiet.stderr, quiet.stderr
    imported = subprocess.run([venv / "bin" / "python", "-c", "import demo; print(demo.ANSWER)"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert imported.stdout.strip() == "42", imported.stderr


def test_sourcing_the_script_installs_nothing(tmp_path):
    """`main` runs only when the script is executed: sourcing it from elsewhere changes no directory."""
    done = subprocess.run(
        ["bash", "-c", f"source {REPO / 'scripts' / 'install.sh'} && pwd && type pip_quietly >/dev/null"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path), done.stderr
    assert not (tmp_path / ".venv").exists()
