"""Readers for the deployment files, as the tools that consume them read them: the Dockerfile's instructions
and stages, the build context that .dockerignore lets through, and Compose's variable interpolation.

Small on purpose: each covers what this repo's files use, and fails loudly on anything else.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


# ---------------------------------------------------------------- Dockerfile


@dataclass
class Instruction:
    keyword: str  # upper case: RUN, ENV, ...
    args: str  # the rest of the instruction, continuation lines joined
    flags: list[str] = field(default_factory=list)  # leading --name=value options (RUN --mount, COPY --from)
    line: int = 0

    def exec_form(self) -> list[str]:
        """The JSON array of CMD/ENTRYPOINT (and HEALTHCHECK's CMD); shell form is not used in this repo."""
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.args
        return value


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def args(self) -> dict[str, str]:
        """This stage's ARG defaults."""
        out = {}
        for instruction in self.all("ARG"):
            name, _, default = instruction.args.partition("=")
            out[name.strip()] = default.strip()
        return out

    def env(self) -> dict[str, str]:
        """This stage's own ENV, in order (KEY=VALUE form only)."""
        out: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for token in shlex.split(instruction.args):
                key, sep, value = token.partition("=")
                assert sep, f"line {instruction.line}: use ENV KEY=VALUE"
                out[key] = value
        return out


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def stage_args(self, stage: Stage, build_args: dict[str, str] | None = None) -> dict[str, str]:
        """The values of a stage's ARGs as Docker sets them: a build arg, else the stage's default, else (an ARG
        without one) the default of the global ARG of that name."""
        given = build_args or {}
        out = {}
        for instruction in stage.all("ARG"):
            name, has_default, default = instruction.args.partition("=")
            name = name.strip()
            fallback = default.strip() if has_default else self.global_args.get(name, "")
            out[name] = given.get(name, fallback)
        return out

    def resolve_base(self, stage: Stage, build_args: dict[str, str] | None = None) -> str:
        values = {**self.global_args, **(build_args or {})}
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values[m.group(1) or m.group(2)], stage.base)

    def chain(self, name: str, build_args: dict[str, str] | None = None) -> list[Stage]:
        """The stages that make `name`, base first (stages built FROM other stages)."""
        stage = self.stage(name)
        base = self.resolve_base(stage, build_args)
        names = {s.name for s in self.stages}
        return (self.chain(base, build_args) if base in names else []) + [stage]


def _logical_lines(text: str):
    """(line number, text) of each instruction: continuations joined, comment lines dropped."""
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment lines, also inside a continued instruction
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1].strip())
            continue
        buffer.append(stripped)
        yield start, " ".join(buffer)
        buffer = []
    assert not buffer, "the Dockerfile ends inside a continued instruction"


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, text in _logical_lines(path.read_text(encoding="utf-8")):
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        flags = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            assert len(parts) in (1, 3) and (len(parts) == 1 or parts[1].upper() == "AS"), text
            stages.append(Stage(base=parts[0], name=parts[2] if len(parts) == 3 else None))
        elif not stages:
            assert keyword == "ARG", f"line {number}: only ARG may come before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name.strip()] = default.strip()
        else:
            stages[-1].instructions.append(Instruction(keyword, rest, flags, number))
    return Dockerfile(global_args, stages)


# ---------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regex over '/'-separated paths."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


class DockerIgnore:
    """Docker's rules: the last pattern that matches a path or one of its parent directories decides."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str], str]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            include = line.startswith("!")
            cleaned = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            self.rules.append((include, _pattern_regex(cleaned), cleaned))

    def excluded(self, relpath: str) -> bool:
        parts = relpath.split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        excluded = False
        for include, regex, _ in self.rules:
            if any(regex.match(c) for c in candidates):
                excluded = not include
        return excluded

    def may_include_under(self, reldir: str) -> bool:
        """Whether some allow pattern could take back a path below an excluded directory."""
        return any(include and source.startswith(reldir + "/") for include, _, source in self.rules)


def build_context(root: Path = REPO) -> list[str]:
    """The files (relative, '/'-separated) that `docker build` would send from `root`."""
    ignore = DockerIgnore(DOCKERIGNORE.read_text(encoding="utf-8"))
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root).as_posix()
        rel = "" if rel == "." else rel + "/"
        dirnames[:] = [
            d for d in dirnames if not ignore.excluded(rel + d) or ignore.may_include_under(rel + d)
        ]
        files += [rel + f for f in filenames if not ignore.excluded(rel + f)]
    return sorted(files)


# ---------------------------------------------------------------- Compose interpolation

_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)"
)


class MissingVariable(ValueError):
    pass


def interpolate(value, env: dict[str, str]):
    """Compose's interpolation of every string in a parsed compose file: $VAR, ${VAR}, ${VAR:-default},
    ${VAR-default}, ${VAR:?message}, ${VAR?message}, ${VAR:+alt}, and $$ for a literal $."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        present = name in env
        nonempty = bool(env.get(name))
        if op == ":-":
            return env[name] if nonempty else arg
        if op == "-":
            return env[name] if present else arg
        if op == ":?":
            if not nonempty:
                raise MissingVariable(f"{name}: {arg}")
            return env[name]
        if op == "?":
            if not present:
                raise MissingVariable(f"{name}: {arg}")
            return env[name]
        if op == ":+":
            return arg if nonempty else ""
        if op == "+":
            return arg if present else ""
        return env.get(name, "")

    return _VARIABLE.sub(substitute, value)


def required_variables(value) -> set[str]:
    """The names used as ${VAR:?...} or ${VAR?...} anywhere in a parsed compose file."""
    if isinstance(value, dict):
        return set().union(*(required_variables(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(required_variables(v) for v in value)) if value else set()
    if not isinstance(value, str):
        return set()
    return {m.group("braced") for m in _VARIABLE.finditer(value) if (m.group("op") or "").endswith("?")}
