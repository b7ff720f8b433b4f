"""What the ``inferwire`` subcommands share on the command line.

Every ordinary mistake is one line on stderr and exit status 2 (argparse's status for a usage
error), never a traceback: :class:`Parser` prints its errors so, the ``type=`` validators below
refuse bad values while parsing, and what can only be found later (a port in use, a host that
does not resolve, a file that is not a certificate) is raised as :class:`CommandError` and
printed by :func:`run`. :class:`HelpFormatter` shows each option's default.
"""

from __future__ import annotations

import argparse
import errno
import math
import socket
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, Protocol, TypeAlias

from inferwire._runtime.extras import MissingExtraError

USAGE_ERROR: Final = 2


class CommandError(Exception):
    """A mistake found after parsing; its message is the one line printed."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to every option that has a default (not to flags, nor to options
    that are unset unless given), keeps a description's paragraphs, and wraps lines between
    words only."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(
            "\n".join(indent + line for line in _wrap(paragraph, width - len(indent)))
            for paragraph in text.split("\n\n")
        )

    def _split_lines(self, text: str, width: int) -> list[str]:
        return _wrap(text, width)


def _wrap(text: str, width: int) -> list[str]:
    # never inside a name such as stream-2048-top5 or --prefill-ms
    return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser (and, through ``add_subparsers``, its subcommands' parsers) whose
    usage errors are one line: ``PROG: error: MESSAGE (see PROG --help)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(
            USAGE_ERROR,
            f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n",
        )


Commands: TypeAlias = "argparse._SubParsersAction[Parser]"
"""What ``Parser.add_subparsers`` returns: each subcommand module adds its own to it."""


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parses ``argv`` and runs the chosen subcommand (its ``run`` default); a
    :class:`CommandError` or a missing extra is printed as one line, exit status 2. A
    subcommand that sets ``any_arguments`` (one that only says what to install) takes any."""
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.run(args))
    except (CommandError, MissingExtraError) as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


# -- type= validators: each returns the value or raises ArgumentTypeError with the reason ------


def split_address(address: str, default_port: int = 0) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a URL's authority into (host, port)."""
    if "://" in address:
        address = address.split("://", 1)[1].split("/", 1)[0]
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.lstrip(":")
        return host, int(port) if port else default_port
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, default_port
    return host, int(port)


def port(text: str) -> int:
    """A TCP port to listen on, 0 (any free port) to 65535."""
    return _integer(text, lowest=0, highest=65535, noun="a port")


def listen_address(text: str) -> str:
    """``HOST:PORT`` to listen on, port 0 for any free one."""
    return _address(text, lowest_port=0)


def connect_address(text: str) -> str:
    """``HOST:PORT`` (or ``[V6]:PORT``) of a server."""
    return _address(text, lowest_port=1)


def _address(text: str, *, lowest_port: int) -> str:
    host, _, port_text = text.rpartition(":")
    if not host or not port_text or host.strip("[]") == "":
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    _integer(port_text, lowest=lowest_port, highest=65535, noun="a port")
    if ":" in host and not host.startswith("["):
        raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 address as [ADDRESS]:PORT")
    return text


def non_negative(text: str) -> float:
    """A finite number, 0 or more."""
    number = _finite(text)
    if number < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return number


def positive(text: str) -> float:
    """A finite number above 0."""
    number = _finite(text)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return number


def _finite(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return number


def count(text: str) -> int:
    """An integer, 0 or more."""
    return _integer(text, lowest=0)


def positive_count(text: str) -> int:
    """An integer, 1 or more."""
    return _integer(text, lowest=1)


def _integer(
    text: str, *, lowest: int, highest: int | None = None, noun: str = "an integer"
) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if highest is not None and not lowest <= number <= highest:
        raise argparse.ArgumentTypeError(f"{number} is not {noun} ({lowest} to {highest})")
    if number < lowest:
        raise argparse.ArgumentTypeError(f"{number} is below {lowest}")
    return number


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text} {what}")
    return path


# -- checks before a server starts or a client connects ----------------------------------------


def authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(host: str, port: int, *, passive: bool = False) -> list[tuple[Any, ...]]:
    """``getaddrinfo`` for a TCP socket; a host that does not resolve is a CommandError."""
    try:
        return socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE if passive else 0
        )
    except socket.gaierror as exc:
        raise CommandError(f"cannot resolve host {host!r}: {exc.strerror}") from None


def check_can_listen(host: str, port: int) -> None:
    """Binds every address ``host`` resolves to, as asyncio's ``create_server`` binds them
    (SO_REUSEADDR; IPv6 sockets v6-only), and lets them go: a port in use, an address this
    machine does not have, or a privileged port is named here, before the server's own
    library reports it its way (grpc logs a line of its own and raises a bare RuntimeError).
    A port taken in between is still caught at the server's start."""
    if not host:
        raise CommandError("an empty host; to listen on every interface give 0.0.0.0 or ::")
    for family, kind, proto, _, sockaddr in resolve(host, port, passive=True):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                raise CommandError(listen_failure(host, port, exc)) from None


def listen_failure(host: str, port: int, exc: BaseException) -> str:
    """One line saying why listening on ``host:port`` failed."""
    where = f"cannot listen on {authority(host, port)}"
    code = getattr(exc, "errno", None)
    if code == errno.EADDRINUSE:
        return f"{where}: port {port} is in use"
    if code == errno.EADDRNOTAVAIL:
        return f"{where}: {host} is not an address of this machine"
    if code == errno.EACCES and 0 < port < 1024:
        return f"{where}: permission denied (ports below 1024 need privileges)"
    return f"{where}: {getattr(exc, 'strerror', None) or exc}"


def split_checked(address: str) -> tuple[str, int]:
    """(host, port) of an address a validator above has accepted, the host resolved."""
    host, port_number = split_address(address)
    resolve(host, port_number)
    return host, port_number


def add_loop_argument(parser: argparse.ArgumentParser) -> None:
    """``--loop {auto,asyncio,uvloop}`` (:mod:`inferwire._runtime.loops`)."""
    from inferwire._runtime import loops  # here: loops imports asyncio, which the engine needs not

    parser.add_argument(
        "--loop",
        choices=loops.LOOPS,
        default="auto",
        help="the event loop: auto is uvloop when installed (pip install 'inferwire[uvloop]')",
    )


def add_trace_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--trace`` and ``--trace-endpoint URL`` (:mod:`inferwire.transports.tracing`)."""
    parser.add_argument(
        "--trace",
        action="store_true",
        help=f"export OpenTelemetry spans of {what} over OTLP/HTTP "
        "(pip install 'inferwire[trace]')",
    )
    parser.add_argument(
        "--trace-endpoint",
        metavar="URL",
        help="the OTLP/HTTP traces URL, for --trace (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,"
        " else $OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces, else http://127.0.0.1:4318/v1/traces)",
    )


class TraceOptions(Protocol):
    """What :func:`check_trace_arguments` reads: a Namespace, or a command's options."""

    @property
    def trace(self) -> bool: ...

    @property
    def trace_endpoint(self) -> str | None: ...


def check_trace_arguments(args: TraceOptions) -> None:
    if args.trace_endpoint is not None and not args.trace:
        raise CommandError("--trace-endpoint is for --trace, which is not given")
    if args.trace_endpoint is not None and not args.trace_endpoint.startswith(
        ("http://", "https://")
    ):
        raise CommandError(f"--trace-endpoint {args.trace_endpoint!r} is not an http(s) URL")
