"""The `txl` command line, run through its console script as a user would (subprocesses, a pseudo-terminal)."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest
from txl_client import Client
from txl_server.sessions.redis_server import free_port

from tests.helpers.gate import Gate
from tests.helpers.long_work import beside_long_work

from .conftest import API_KEY

BIN = Path(sys.executable).parent
TXL = str(BIN / "txl")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

pytestmark = pytest.mark.skipif(not Path(TXL).exists(), reason="the txl console script is not installed")


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 60):
    environment = {k: v for k, v in os.environ.items() if k not in ("TXL_URL", "TXL_API_KEY")}
    environment.update(env or {})
    return subprocess.run(
        [TXL, *args], env=environment, input=stdin, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def env(server) -> dict[str, str]:
    return {"TXL_URL": server.url, "TXL_API_KEY": API_KEY}


@pytest.fixture
def sdk(server):
    with Client(server.url, API_KEY) as client:
        yield client


# ---------------------------------------------------------------------------------------------- basics


def test_version_help_and_usage_errors_exit_2(tmp_path):
    version = run("--version")
    assert version.returncode == 0 and version.stdout.strip() == "txl 0.1.0"
    assert "generate" in run("--help").stdout
    for args in (
        [],
        ["bogus"],
        ["generate"],
        ["generate", "x", "--max-tokens", "-3"],
        ["sessions"],
        ["score"],
    ):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr and not result.stdout, args
    missing = run("score", str(tmp_path / "missing.txt"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in run("score", str(tmp_path / "binary.txt")).stderr


def test_every_command_argument_and_flag_says_what_it_is():
    """`--help` of every command: `conversations say --temperature` and `sessions fork ID` said nothing."""
    from txl_client.cli import build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif not isinstance(action, argparse._HelpAction | argparse._VersionAction) and not action.help:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.metavar}")

    walk(build_parser(), ["txl"])
    assert not missing, missing


def test_no_server_at_the_address_says_to_start_one_or_give_its_address():
    result = run("sessions", "ls", "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "5")
    assert result.returncode == 1 and "cannot reach" in result.stderr, result.stderr
    assert "bash scripts/serve.sh" in result.stderr and "--url or TXL_URL" in result.stderr, result.stderr


def test_server_and_api_errors_exit_1(server, env):
    not_found = run("sessions", "show", "nope", env=env)
    assert not_found.returncode == 1 and "404 not_found" in not_found.stderr and not not_found.stdout
    wrong_key = run("sessions", "ls", "--api-key", "wrong", env=env)  # the flag wins over TXL_API_KEY
    assert wrong_key.returncode == 1 and "401 unauthorized" in wrong_key.stderr
    unreachable = run("sessions", "ls", "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


# ---------------------------------------------------------------------------------------------- generate, sessions


def test_generate_streams_a_new_session_then_continues_it(server, env, sdk):
    result = run("generate", "The whale", "--max-tokens", "20", "--temperature", "0", env=env)
    assert result.returncode == 0, result.stderr
    expected = sdk.generate(sdk.create_session().id, "The whale", max_tokens=20, temperature=0)
    assert result.stdout == expected.text + ("" if expected.text.endswith("\n") else "\n")
    session_id = re.search(r"session (\S+) \(version 2", result.stderr).group(1)

    more = run(
        "--url", server.url, "--api-key", API_KEY,  # flags instead of the environment
        "generate", "--session", session_id, " and", "--max-tokens", "5", "--seed", "1", "--top-k", "5", "--top-p", "0.9",
    )  # fmt: skip
    assert more.returncode == 0, more.stderr
    assert sdk.get_session(session_id).version == 3

    as_json = run("generate", "--session", session_id, "--max-tokens", "3", "--json", env=env)
    assert json.loads(as_json.stdout)["session"]["version"] == 4
    removed = run("generate", "-", "--rm", "--max-tokens", "2", env=env, stdin="from stdin")
    assert removed.returncode == 0 and "session" not in removed.stderr


def test_generate_samples_with_temperature_0_8_and_top_p_0_95_by_default(server, env, sdk):
    """The CLI's defaults are the ones that read well with the bundled model (docs/clients.md), and a seed makes
    them reproducible: the same tokens as the SDK asked for those settings explicitly."""
    result = run("generate", "The whale", "--max-tokens", "40", "--seed", "11", "--rm", env=env)
    assert result.returncode == 0, result.stderr
    expected = sdk.generate(
        sdk.create_session().id, "The whale", max_tokens=40, temperature=0.8, top_p=0.95, seed=11
    )
    assert result.stdout == expected.text + ("" if expected.text.endswith("\n") else "\n")
    different = sdk.generate(sdk.create_session().id, "The whale", max_tokens=40, temperature=1.0, seed=11)
    assert different.text != expected.text  # the defaults are not the server's own (temperature 1, top-p 1)


def test_a_long_prompt_shows_its_progress_and_does_not_time_out(server, env, sdk):
    """`head -c 50000 moby.txt | txl --timeout 5 generate -`: reading the prompt takes the server longer than the
    timeout, but it reports its progress meanwhile: the CLI draws it and waits."""
    prompt = "Call me Ishmael. Some years ago, never mind how long precisely, I went to sea. " * 20
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    with Gate(runner, "run", delay=4.0 / (len(prompt) / 8)):  # 4 s: a segment (8 tokens) per forward
        result = run("--timeout", "1", "generate", "-", "--max-tokens", "5", "--progress", "--rm", env=env,
                     stdin=prompt)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"prompt [{'#' * 30}] 100% {len(prompt)}/{len(prompt)} tokens" in result.stderr
    assert "timed out" not in result.stderr and result.stdout.strip()


def test_a_generation_waiting_beside_long_work_says_so_instead_of_looking_hung(server, env, sdk):
    """A token that waits beside a long score: `txl generate` says how long it has waited and what the server
    runs meanwhile (GET /v1/system), until the text arrives."""
    with beside_long_work(server, sdk):
        result = run("generate", "The sea", "--max-tokens", "2", "--progress", env=env)
    assert result.returncode == 0, result.stderr
    said = re.findall(
        r"waiting for the first token: \d+ s; the server is running (\d+) requests?(?:, (\d+) more waiting)?",
        result.stderr,
    )
    assert said, result.stderr
    assert max(int(r) + int(w or 0) for r, w in said) >= 2, (
        said,
        result.stderr,
    )  # the score, and this generation


def test_a_real_timeout_says_timed_out_not_conflict_and_changes_nothing(server, env, sdk):
    session = sdk.create_session(text="waiting")
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    with Gate(runner, "run") as gate:  # the server takes its time, and says nothing
        result = run("--timeout", "1", "generate", "more", "--session", session.id, env=env)
        assert gate.entered.is_set(), result.stderr
    assert result.returncode == 1
    assert result.stderr.startswith("txl: error: timed out: no answer from http://127.0.0.1:")
    assert "within 1 s (wait longer with --timeout SECONDS)" in result.stderr
    assert "409" not in result.stderr and "conflict" not in result.stderr
    # The server cancelled the abandoned generation: nothing was committed, and the session is free.
    gone = 'txl_requests_total{method="POST",route="/v1/sessions/{session_id}/generate",status="499"}'
    deadline = time.monotonic() + 10
    while gone not in httpx.get(server.url + "/metrics").text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sdk.get_session(session.id).version == session.version
    assert sdk.generate(session.id, max_tokens=2).session.version == session.version + 1


def test_sessions_ls_show_rm(env, sdk):
    session = sdk.create_session(text="listed", metadata={"who": "cli"})
    listed = run("sessions", "ls", env=env)
    assert listed.returncode == 0 and re.search(rf"^{session.id}\s+6\s+7/32\s+1\s", listed.stdout, re.M), (
        listed.stdout
    )
    assert session.id in [s["id"] for s in json.loads(run("sessions", "ls", "--json", env=env).stdout)]
    shown = json.loads(run("sessions", "show", session.id, env=env).stdout)
    assert shown["id"] == session.id and shown["metadata"] == {"who": "cli"}
    removed = run("sessions", "rm", session.id, env=env)
    assert removed.returncode == 0 and removed.stdout.strip() == f"deleted {session.id}"
    assert run("sessions", "show", session.id, env=env).returncode == 1


# ---------------------------------------------------------------------------------------------- score


def test_score_prints_a_table_json_and_progress(tmp_path, env, sdk):
    short, long = tmp_path / "short.txt", tmp_path / "long.txt"
    short.write_text("Hello there.\n", encoding="utf-8")
    long.write_text("It was the best of times, it was the worst of times. " * 8, encoding="utf-8")
    table = run("score", str(short), str(long), env=env)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["tokens", "bytes", "perplexity", "bits/byte", "file"]
    assert lines[1].split()[-1] == str(short) and lines[3].split()[-1] == "total"
    assert table.stderr == ""  # not a terminal: no progress bar unless asked

    as_json = run("score", str(long), "--json", "--progress", env=env)
    assert as_json.returncode == 0, as_json.stderr
    [row] = json.loads(as_json.stdout)
    expected = sdk.score(long.read_text(encoding="utf-8"))
    assert row["file"] == str(long) and row["tokens"] == expected.tokens
    assert row["perplexity"] == pytest.approx(expected.perplexity, rel=1e-6)
    assert row["bits_per_byte"] == pytest.approx(expected.bits_per_byte, rel=1e-6)
    assert f"100% {expected.tokens}/{expected.tokens} tokens" in as_json.stderr


def test_score_compares_each_file_with_xz_as_the_xz_command_compresses_it(tmp_path, env):
    """`--xz`: the model's bits per byte beside xz -9e's on the user's own file (the bundled model's figure
    against xz holds for the kinds of text it was trained on; here the reader checks theirs)."""
    from txl_client.cli.remote import xz_bits

    prose, code = tmp_path / "prose.txt", tmp_path / "code.txt"
    prose.write_text("It was the best of times, it was the worst of times. " * 30, encoding="utf-8")
    code.write_text("def f(x):\n    return x + 1\n" * 20, encoding="utf-8")
    table = run("score", str(prose), str(code), "--xz", env=env)
    assert table.returncode == 0, table.stderr
    header, first, _, total = table.stdout.splitlines()
    assert header.split() == ["tokens", "bytes", "perplexity", "bits/byte", "xz", "-9e", "vs", "xz", "file"]
    cells = first.split()
    expected = xz_bits(prose.read_text(encoding="utf-8"))
    assert float(cells[4]) == pytest.approx(expected, abs=1e-4)
    assert cells[5] == f"{100 * (float(cells[3]) / expected - 1):+.0f}%"
    if shutil.which("xz"):  # the command's own output: the same size as Python's lzma writes it
        made = subprocess.run(["xz", "-9e", "-c", str(prose)], capture_output=True, check=True).stdout
        assert expected == pytest.approx(8 * len(made) / prose.stat().st_size)
    assert total.split()[-1] == "total" and len(total.split()) == 7
    [row] = json.loads(run("score", str(code), "--xz", "--json", env=env).stdout)
    assert row["xz_bits_per_byte"] == pytest.approx(xz_bits(code.read_text(encoding="utf-8")))


def test_score_prints_each_result_as_it_comes_and_keeps_it_when_a_later_file_fails(server, tmp_path, env):
    """Output to a pipe: the first file's row arrives while the second is still being scored; a third file
    the server refuses (larger than its 64 KiB body limit) ends the run with status 1, naming the file, and
    loses nothing printed before. --json's list stays valid JSON."""
    short, slow, big = tmp_path / "short.txt", tmp_path / "slow.txt", tmp_path / "big.txt"
    short.write_text("Hello there.\n", encoding="utf-8")
    slow.write_text("It was the best of times, it was the worst of times. " * 2, encoding="utf-8")
    big.write_text("x" * 70_000, encoding="utf-8")
    runner = server.app.state.runtime.service.worker.runner  # each call: one forward of the engine
    environment = {k: v for k, v in os.environ.items() if k not in ("TXL_URL", "TXL_API_KEY")} | env
    with Gate(runner, "run", delay=0.15):  # the slow file: 14 forwards, ~2 s
        process = subprocess.Popen(
            [TXL, "score", str(short), str(slow), str(big)],
            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout is not None
        header, first = process.stdout.readline(), process.stdout.readline()
        assert process.poll() is None  # still scoring the slow file
        rest, errors = process.communicate(timeout=60)
    assert header.split()[-1] == "file" and first.split()[-1] == str(short)
    assert process.returncode == 1 and rest.splitlines()[0].split()[-1] == str(slow)
    assert len(rest.splitlines()) == 1  # no total: the run did not finish
    assert errors.startswith(f"txl: error: {big}: 413 payload_too_large"), errors

    as_json = run("score", str(short), str(big), "--json", env=env)
    assert as_json.returncode == 1 and str(big) in as_json.stderr
    alone = run("score", str(big), env=env)  # its only file fails: no table, not even its header
    assert alone.returncode == 1 and alone.stdout == "", alone.stdout
    assert [row["file"] for row in json.loads(as_json.stdout)] == [str(short)]


# ---------------------------------------------------------------------------------------------- chat


class Terminal:
    """A program on a pseudo-terminal: write lines, read until a pattern shows."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.fd, child = pty.openpty()
        environment = {**os.environ, **env, "TERM": "dumb"}
        self.process = subprocess.Popen(
            args, stdin=child, stdout=child, stderr=child, env=environment, start_new_session=True
        )
        os.close(child)
        self.output = ""

    def expect(self, pattern: str, timeout: float = 20) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.output)
            if match:
                self.output = self.output[match.end() :]
                return match
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {pattern!r}; got {self.output!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    data = os.read(self.fd, 4096)
                except OSError:  # the program ended
                    data = b""
                if not data:
                    assert re.search(pattern, self.output), f"ended before {pattern!r}; got {self.output!r}"
                self.output += ANSI.sub("", data.decode("utf-8", errors="replace")).replace("\r", "")

    def send(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\n")

    def close(self) -> int:
        try:
            return self.process.wait(timeout=10)
        finally:
            os.close(self.fd)


def test_chat_on_a_terminal_appends_generates_forks_and_quits(env, sdk):
    terminal = Terminal([TXL, "chat", "--max-tokens", "8", "--temperature", "0"], env)
    try:
        first = terminal.expect(r"txl chat on session (\S+) \(model tiny-byte\)").group(1)
        terminal.expect(r"\n> ")
        terminal.send("Hello")
        terminal.expect(r"\n> ")
        assert sdk.get_session(first).version == 2  # created, then one generate step
        terminal.send("/info")
        info = terminal.expect(rf"session {first}: (\d+) tokens, memory \d+/32, version 2")
        assert int(info.group(1)) == sdk.get_session(first).tokens == 6 + 8  # "Hello\n", then 8 generated
        terminal.send("/fork")
        fork = terminal.expect(rf"forked {first} -> (\S+); now on (\S+)")
        assert fork.group(1) == fork.group(2) != first
        terminal.send("")  # an empty line just continues, on the fork
        terminal.expect(r"\n> ")
        terminal.send("/info")
        terminal.expect(rf"session {fork.group(1)}: \d+ tokens")
        terminal.send("/nonsense")
        terminal.expect(r"unknown command /nonsense")
        terminal.send("/quit")
        assert terminal.close() == 0
    finally:
        if terminal.process.poll() is None:
            os.killpg(terminal.process.pid, signal.SIGKILL)
    assert sdk.get_session(first).version == 2  # the fork moved on, its parent did not
    assert sdk.get_session(fork.group(1)).tokens == sdk.get_session(first).tokens + 8


# ---------------------------------------------------------------------------------------------- local commands


def test_serve_starts_the_server_with_its_flags(tiny_model_dir, redis_server):
    help_text = run("serve", "--help")
    assert help_text.returncode == 0 and "--redis-url" in help_text.stdout
    device = " ".join(help_text.stdout[help_text.stdout.index("--device DEVICE  ") :].split()[:40])
    assert "cuda:N for an NVIDIA GPU" in device  # not only "default cpu"
    port = free_port()
    process = subprocess.Popen(
        [TXL, "serve", "--port", str(port), "--model", str(tiny_model_dir), "--redis-url", redis_server.url,
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "txl serve did not become ready"
            time.sleep(0.1)
        with Client(f"http://127.0.0.1:{port}") as client:
            assert [m.id for m in client.models()] == ["tiny-byte"]
    finally:
        process.send_signal(signal.SIGINT)
        # uvicorn shuts down, then re-raises the signal so that the exit status says what stopped it
        assert process.wait(timeout=30) in (0, -signal.SIGINT)


def test_serve_without_the_server_installed_says_how_to_install_it(monkeypatch, capsys):
    from txl_client.cli import main

    monkeypatch.setitem(sys.modules, "txl_server.__main__", None)  # as if txl_server were not installed
    assert main(["serve", "--port", "1"]) == 1
    assert "pip install 'txl-serve[server]'" in capsys.readouterr().err


@pytest.mark.oracle
def test_convert_an_hf_transfo_xl_directory(tmp_path):
    transformers = pytest.importorskip(
        "transformers", reason="the HF reference (transformers==4.35.2) is needed"
    )
    import torch
    import txl
    from txl.tokenizers import load_tokenizer

    corpus = ["the cat sat on the mat .", "a dog , the cat and 2 @,@ 000 birds !", "the mat is on the cat ."]
    vocab_file = tmp_path / "vocab.txt"
    symbols = sorted({word for line in corpus for word in line.split()})
    vocab_file.write_text("\n".join(["<eos>", "<unk>", *symbols]) + "\n", encoding="utf-8")
    hf_dir = tmp_path / "transfo-xl-tiny"
    hf_dir.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = transformers.TransfoXLTokenizer(vocab_file=str(vocab_file))
        tokenizer.save_vocabulary(str(hf_dir))  # vocab.pkl, as downloaded
        config = transformers.TransfoXLConfig(
            vocab_size=len(tokenizer.idx2sym), cutoffs=[6], div_val=2, d_model=32, d_embed=32, n_head=4, d_head=8,
            d_inner=48, n_layer=2, mem_len=12, tgt_len=8, clamp_len=1000, same_length=False, dropout=0.0,
        )  # fmt: skip
        torch.manual_seed(0)
        reference = transformers.TransfoXLLMHeadModel(config).eval()
        with torch.no_grad():
            for param in reference.parameters():
                param.add_(0.2 * torch.randn_like(param))
        reference.save_pretrained(str(hf_dir), safe_serialization=False)  # pytorch_model.bin
    assert (hf_dir / "vocab.pkl").is_file() and (hf_dir / "pytorch_model.bin").is_file()

    out_dir = tmp_path / "converted"
    converted = run("convert", str(hf_dir), str(out_dir))
    assert converted.returncode == 0, converted.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]

    model, ours = txl.load_pretrained(out_dir), load_tokenizer(out_dir)
    text = "the cat sat on the mat . the dog is on the cat ."
    ids = ours.encode(text)
    assert ids == tokenizer.encode(text)
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        hidden, _ = model(tokens, model.empty_memory())
        logits = model.log_probs(hidden)
    empty = [torch.empty(0, 1, config.d_model) for _ in range(config.n_layer)]  # HF's mems=None means zeros
    with torch.no_grad():
        expected = reference(tokens, mems=empty).prediction_scores
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)

    again = run("convert", str(hf_dir), str(out_dir))
    assert again.returncode == 2 and "--force" in again.stderr
    assert run("convert", str(hf_dir), str(out_dir), "--force").returncode == 0
    not_hf = run("convert", str(tmp_path / "nowhere"), str(tmp_path / "x"))
    assert not_hf.returncode == 2 and "not a directory" in not_hf.stderr
