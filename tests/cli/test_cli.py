"""The ``inferwire`` command as a user meets it: every ordinary mistake is one line on stderr
naming the problem and exit status 2, never a traceback; every option's help shows its
default; the help lists the codecs, transports and workloads to choose from.

The mistakes run through the real entry point (``python -m inferwire.cli.main``, what
the ``inferwire`` script calls), all started at once, since each pays an interpreter's start.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

import inferwire.codecs as ic
import inferwire.transports as it
from inferwire import workloads
from inferwire.cli import main as cli

INFERWIRE: Final = (sys.executable, "-m", "inferwire.cli.main")
CHILD_ENTRY: Final = (sys.executable, "-m", "inferwire.cli")
"""How servers, engines and load runs are started as children (``cli/__main__.py``)."""
TIMEOUT_S: Final = 120.0
BUSY: Final = "{busy}"  # replaced by the port of a socket this module holds, listening
CLOSED: Final = "{closed}"  # replaced by a port bound by nobody's listener: connections refused


@dataclass(frozen=True, slots=True)
class Mistake:
    args: tuple[str, ...]
    names: str
    """A regular expression the one line must match: the problem, named."""
    command: tuple[str, ...] = INFERWIRE


MISTAKES: Final = (
    Mistake((), r"inferwire: error: the following arguments are required: COMMAND"),
    Mistake(("nosuch",), r"invalid choice: 'nosuch'"),
    Mistake(("serve",), r"inferwire serve: error: .*required: --transport"),
    Mistake(("serve", "--transport", "http1", "--port", "99999"), r"--port: 99999 is not a port"),
    Mistake(("serve", "--transport", "grpc", "--port", "99999"), r"--port: 99999 is not a port"),
    Mistake(("serve", "--transport", "tcp", "--port", "-5"), r"--port: -5 is not a port"),
    Mistake(("serve", "--transport", "http1", "--port", BUSY), r"port \d+ is in use"),
    Mistake(("serve", "--transport", "grpc", "--port", BUSY), r"port \d+ is in use"),
    Mistake(
        ("serve", "--transport", "grpc", "--port", BUSY),
        r"^inferwire serve: error: .*port \d+ is in use",
        CHILD_ENTRY,
    ),
    Mistake(
        ("serve", "--transport", "grpc", "--host", "nope.invalid"),
        r"cannot resolve host 'nope.invalid'",
    ),
    Mistake(("serve", "--transport", "tcp", "--host", ""), r"an empty host"),
    Mistake(
        ("serve", "--transport", "http1", "--tls", "--certfile", "/nonexistent/cert.pem"),
        r"--certfile: /nonexistent/cert.pem does not exist",
    ),
    Mistake(
        ("serve", "--transport", "http1", "--tls", "--certfile", __file__, "--keyfile", __file__),
        r"cannot use --certfile/--keyfile: .*PEM",
    ),
    Mistake(
        ("serve", "--transport", "http1", "--tls", "--certfile", __file__),
        r"--certfile and --keyfile go together",
    ),
    Mistake(
        ("serve", "--transport", "http1", "--certfile", __file__, "--keyfile", __file__),
        r"--certfile is for --tls, which is not given",
    ),
    Mistake(("serve", "--transport", "http1", "--prefill-ms", "-5"), r"--prefill-ms: -5 is negat"),
    Mistake(("serve", "--transport", "http1", "--decode-ms", "inf"), r"--decode-ms: 'inf' is not"),
    Mistake(("serve", "--transport", "tcp", "--codec", "xml"), r"--codec: invalid choice: 'xml'"),
    Mistake(("proxy", "--upstream", "nope"), r"--upstream: 'nope' is not HOST:PORT"),
    Mistake(("proxy", "--upstream", "127.0.0.1:99999"), r"--upstream: 99999 is not a port"),
    Mistake(("proxy", "--upstream", "nope.invalid:80"), r"cannot resolve host 'nope.invalid'"),
    Mistake(("proxy", "--upstream", "::1:80"), r"write an IPv6 address as \[ADDRESS\]:PORT"),
    Mistake(
        ("proxy", "--upstream", "127.0.0.1:80", "--listen", f"127.0.0.1:{BUSY}"),
        r"port \d+ is in use",
    ),
    Mistake(("proxy", "--upstream", "127.0.0.1:80", "--delay-ms", "-1"), r"--delay-ms: -1 is neg"),
    Mistake(
        ("proxy", "--upstream", "127.0.0.1:80", "--bandwidth-mbps", "0"),
        r"--bandwidth-mbps: 0 is not above 0",
    ),
    Mistake(("report", "--out", "/nonexistent"), r"no results to report: .*codecs.json"),
    Mistake(("bench", "--max-time", "-1"), r"--max-time: -1 is not above 0"),
    Mistake(("bench", "--out", __file__), r"cannot write results to .*Not a directory"),
    Mistake(
        ("load", "--transport", "tcp"), r"give --url URL --api API, --address HOST:PORT, or --spawn"
    ),
    Mistake(
        ("load", "--transport", "tcp", "--address", "nope.invalid:80"),
        r"cannot resolve host 'nope.invalid'",
    ),
    Mistake(
        ("load", "--transport", "tcp", "--address", f"127.0.0.1:{CLOSED}", "--warmup", "1"),
        r"the warm-up failed, nothing was measured: .*127\.0\.0\.1",
    ),
    Mistake(
        ("load", "--transport", "tcp", "--spawn", "--workload", "image-fp32"),
        r"--workload: invalid choice: 'image-fp32'",
    ),
    Mistake(("load", "--transport", "tcp", "--spawn", "--rate", "0"), r"--rate: rates must be"),
    Mistake(
        ("load", "--transport", "tcp", "--spawn", "--requests", "0"), r"--requests: 0 is below"
    ),
    Mistake(
        ("load", "--transport", "tcp", "--address", "127.0.0.1:80", "--prefill-ms", "5"),
        r"--prefill-ms/--decode-ms set a --spawn'ed server",
    ),
    Mistake(("load", "--transport", "tcp", "--spawn", "--out", "/"), r"--out / is a directory"),
    Mistake(
        ("load", "--transport", "tcp", "--address", "127.0.0.1:80", "--server-pid", "99999999"),
        r"--server-pid 99999999: no such process",
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    returncode: int
    stderr: str


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, str]]:
    """A port in use (a socket listening on 127.0.0.1) and one that refuses connections (bound,
    not listening), held for the module."""
    with socket.socket() as busy, socket.socket() as closed:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        closed.bind(("127.0.0.1", 0))
        yield {BUSY: str(busy.getsockname()[1]), CLOSED: str(closed.getsockname()[1])}


@pytest.fixture(scope="module")
def outcomes(ports: dict[str, str]) -> dict[Mistake, Outcome]:
    """Every mistake's run, all started at once."""

    def filled(arg: str) -> str:
        for placeholder, port in ports.items():
            arg = arg.replace(placeholder, port)
        return arg

    started = {
        mistake: subprocess.Popen(
            [*mistake.command, *map(filled, mistake.args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mistake in MISTAKES
    }
    results = {}
    for mistake, process in started.items():
        try:
            _, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=TIMEOUT_S)
            stderr = f"(still running after {TIMEOUT_S:g} s) {stderr}"
        results[mistake] = Outcome(process.returncode, stderr)
    return results


def _id(mistake: Mistake) -> str:
    how = "python -m inferwire.cli " if mistake.command == CHILD_ENTRY else ""
    return how + (" ".join(mistake.args) or "(nothing)")


@pytest.mark.parametrize("mistake", MISTAKES, ids=_id)
def test_a_mistake_is_one_line_and_status_2(
    mistake: Mistake, outcomes: dict[Mistake, Outcome]
) -> None:
    outcome = outcomes[mistake]
    assert "Traceback" not in outcome.stderr
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, outcome.stderr
    assert re.search(mistake.names, lines[0]), lines[0]
    assert outcome.returncode == 2, outcome


def test_proxy_warns_of_an_upstream_that_refuses_and_starts(ports: dict[str, str]) -> None:
    """The upstream may start after its proxy, so this is a warning, not an error."""
    process = subprocess.Popen(
        [*INFERWIRE, "proxy", "--upstream", f"127.0.0.1:{ports[CLOSED]}", "--delay-ms", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=TIMEOUT_S)
    assert first.startswith("listening on 127.0.0.1:")
    assert f"127.0.0.1:{ports[CLOSED]} does not accept connections" in stderr
    assert process.returncode == 0


COMMANDS: Final = ("bench", "report", "serve", "proxy", "load")


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    """``inferwire [COMMAND] --help`` as printed, by command ("" for the top level)."""
    texts = {}
    for command in ("", *COMMANDS):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exited:
            cli.main([*command.split(), "--help"])
        assert exited.value.code == 0
        texts[command] = printed.getvalue()
    return texts


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(commands.choices)


def test_the_top_level_help_lists_every_command(helps: dict[str, str]) -> None:
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s+\S", helps[""], re.MULTILINE), command


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_help_and_its_default(command: str, helps: dict[str, str]) -> None:
    parser = _subcommands()[command]
    assert parser.description
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{command} {action.option_strings}: no help"
        if action.default not in (None, False):
            # the default as the help prints it, after the option's own help text
            shown = re.escape(str(action.default))
            assert re.search(rf"\(default: {shown}\)", " ".join(helps[command].split())), (
                command,
                action.dest,
            )


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_is_plain_text(command: str, helps: dict[str, str]) -> None:
    """No reStructuredText of the docstrings: ``literal``, :role:`x`, **strong**."""
    assert not re.search(r"``|:\w+:`|\*\*", helps[command]), helps[command]


def test_the_choices_are_listed(helps: dict[str, str]) -> None:
    flat = {command: " ".join(text.split()) for command, text in helps.items()}
    for name in workloads.names("stream"):
        assert name in flat["load"]
        assert name in flat["serve"]
    for name in (*workloads.names(), *ic.names(), *it.TRANSPORTS):
        assert name in flat["bench"]
    for command in ("serve", "load"):
        for name in (*ic.names(), *it.TRANSPORTS):
            assert name in flat[command]


def test_the_script_is_the_module_that_was_tested() -> None:
    """The ``inferwire`` script calls the entry point the tests above run."""
    script = Path(sys.executable).with_name("inferwire")
    if not script.exists():
        pytest.skip("no inferwire script beside this interpreter (not an installed venv)")
    assert "from inferwire.cli.main import main" in script.read_text()
