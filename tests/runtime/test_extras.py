"""A base install (no extras) says which extra to install instead of failing on an import.

A fresh venv per case is too slow for the suite: each case runs in its own interpreter with
the library made missing (``sys.modules[name] = None`` makes its import raise
``ModuleNotFoundError``, as on an install without it). By hand, once: see the README.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Final

import pytest

from inferwire._runtime import extras

PYPROJECT: Final = Path(__file__).resolve().parents[2] / "pyproject.toml"
TIMEOUT_S: Final = 120.0


def _without(modules: tuple[str, ...], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    hide = "".join(f"sys.modules[{name!r}] = None\n" for name in modules)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{hide}{code}", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize(
    ("transport", "module", "install"),
    [
        ("http1", "httptools", "pip install 'inferwire[transports]'"),
        ("http2", "h2", "pip install 'inferwire[transports]'"),
        ("grpc", "grpc", "pip install 'inferwire[grpc]'"),
    ],
)
def test_a_transport_without_its_library_names_the_extra(
    transport: str, module: str, install: str
) -> None:
    result = _without(
        (module,),
        "import inferwire.transports as it\n"
        "try:\n"
        f"    it.connect({transport!r}, '127.0.0.1:1')\n"
        "except it.MissingExtraError as exc:\n"
        "    print(exc.name, exc, sep='\\n')\n",
    )
    assert result.returncode == 0, result.stderr
    name, message = result.stdout.splitlines()
    assert name == module
    assert message.startswith(f"the {transport} transport needs {extras.EXTRAS[module][0]},")
    assert message.endswith(install)


def test_tcp_needs_no_extra() -> None:
    result = _without(
        ("httptools", "h2", "grpc", "trustme"),
        "import inferwire.transports as it\nit.connect('tcp', '127.0.0.1:1')\n",
    )
    assert result.returncode == 0, result.stderr


def test_test_certificates_without_trustme_name_the_extra() -> None:
    result = _without(
        ("trustme",),
        "import inferwire.transports as it\nit.make_test_certificates()\n",
    )
    assert result.stderr.splitlines()[-1] == (
        "inferwire._runtime.extras.MissingExtraError: making TLS test certificates needs "
        "trustme, which is not installed: pip install 'inferwire[transports]'"
    )


# what a base install lacks: every library of every extra
BASE_INSTALL: Final = tuple(extras.EXTRAS)
CLI: Final = "import sys\nfrom inferwire.cli.main import main\nsys.exit(main())\n"


def test_the_command_on_a_base_install_has_help() -> None:
    result = _without(BASE_INSTALL, CLI, "--help")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^\s+load\s.*needs inferwire\[bench\]", result.stdout, re.MULTILINE)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["load", "--transport", "tcp", "--spawn"],
            "inferwire load: error: the load generator needs",
        ),
        (["bench"], "inferwire bench: error: inferwire bench needs"),
        (
            ["serve", "--transport", "http2"],
            "inferwire serve: error: the http2 transport needs h2",
        ),
        (
            ["serve", "--transport", "tcp", "--tls"],
            "inferwire serve: error: making TLS test certificates needs trustme",
        ),
    ],
)
def test_a_command_on_a_base_install_names_its_extra(args: list[str], line: str) -> None:
    result = _without(BASE_INSTALL, CLI, *args)
    assert result.returncode == 2
    (printed,) = result.stderr.splitlines()
    assert printed.startswith(line)
    extra = "transports" if args[0] == "serve" else "bench"
    assert printed.endswith(f"which is not installed: pip install 'inferwire[{extra}]'")


def test_the_table_matches_pyproject() -> None:
    """The table's libraries of each extra are exactly those pyproject.toml lists in it, and
    each extra includes the extras the table says."""
    optional = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]

    def names(extra: str) -> set[str]:
        requirements = (re.split(r"[<>=!~\[;\s]", r, maxsplit=1)[0] for r in optional[extra])
        return {name.lower() for name in requirements if name != "inferwire"}

    for extra, included in extras.INCLUDES.items():
        in_table = {d for d, needed_by in extras.EXTRAS.values() if needed_by == extra}
        assert names(extra) == in_table, extra
        nested = {r[len("inferwire[") : -1] for r in optional[extra] if r.startswith("inferwire[")}
        assert nested == set(included), extra


def test_a_missing_module_outside_the_table_is_left_as_it_is() -> None:
    with pytest.raises(ModuleNotFoundError) as raised, extras.needs_extras("x"):
        import inferwire_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert type(raised.value) is ModuleNotFoundError


def test_require_names_the_extra_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "h2", None)
    with pytest.raises(extras.MissingExtraError, match=r"pip install 'inferwire\[bench\]'$"):
        extras.require("bench", "the suite")
    extras.require("grpc", "a grpc client")
