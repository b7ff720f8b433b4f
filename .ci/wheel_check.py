"""The wheel a user installs, built and tried as they would get it (``make wheelcheck``).

Builds the sdist from the checkout's files (those ``git ls-files`` lists, tracked or new and
not ignored, copied away from any build output) and the wheel from that sdist (``python -m
build``), so a file the sdist leaves out is missing from the wheel too, then checks:

1. the wheel holds every file of the tree: every one of those files under the folders
   pyproject.toml maps into ``inferwire`` (``package-dir``; modules, stubs, ``py.typed``,
   data), listed by git rather than by the packaging configuration it checks, except the C
   sources, headers and include folders that ``ext-modules`` compiles in; one compiled
   module per extension; nothing from outside the tree (tests/, results/, stale builds);
2. in a fresh venv with the base dependencies only: ``inferwire --help``, ``import
   inferwire.codecs``, a TokenChunk round trip through two codecs, and an import of every
   compiled extension;
3. with the ``bench`` extra added: ``inferwire bench --help`` and ``inferwire load --help``.

Installs are constrained to requirements/constraints.txt (the tested versions). Every command
runs in a temporary directory outside the checkout with ``PYTHONPATH`` unset, and the installed
modules must come from the venv, so neither the editable install nor the source tree can stand
in for a missing file. Exit status 1 names the check that failed and what it found.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
# Lines of a failed command's output to show: enough for a compiler error or pip's resolver.
OUTPUT_TAIL_LINES = 60

# Run in the fresh venv: the codecs a user imports first, on the base dependencies. Protobuf
# and delta read shipped non-Python files (generated modules, .binpb schemas) and have C
# extensions; the JSON codecs write OpenAI's bytes, which need not carry inferwire's own
# fields (seq, token_ids), so their round trip need not give the chunk back whole.
BASE_CHECK = """
import importlib, sys, sysconfig
from pathlib import Path
import inferwire.codecs as ic

chunk = ic.TokenChunk(
    id="chatcmpl-wheelcheck", model="m", created=1700000000, index=0, seq=3,
    token_ids=(17, 4242), text=" hello", finish_reason="stop",
)
for name in ("protobuf", "delta"):
    codec = ic.get(name)
    back = codec.decode(codec.encode(chunk), ic.TokenChunk)
    if back != chunk:
        sys.exit(f"the {name} codec's round trip changed the chunk: {back!r}")
for extension in sys.argv[1:]:
    importlib.import_module(extension)
site = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
elsewhere = sorted(
    f"{name} ({module.__file__})"
    for name, module in list(sys.modules.items())
    if name.startswith("inferwire.") and getattr(module, "__file__", None)
    and not site.intersection(Path(module.__file__).resolve().parents)
)
if elsewhere:
    sys.exit("imported from outside the venv: " + ", ".join(elsewhere))
"""


class CheckFailed(Exception):
    """One check of the wheel failed; the message says which and what it found."""


def main() -> int:
    started = time.monotonic()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools_config = pyproject["tool"]["setuptools"]
    extensions = [ext["name"] for ext in setuptools_config.get("ext-modules", [])]
    with tempfile.TemporaryDirectory(prefix="inferwire-wheelcheck-") as temporary:
        work = Path(temporary)
        venv = work / "venv"
        try:
            files = _checkout_files()
            wheel = _build(work, files)
            _check_contents(wheel, files, setuptools_config)
            _check_base_install(work, venv, wheel, extensions)
            _check_bench_install(work, venv, wheel)
        except CheckFailed as failure:
            print(f"wheel check FAILED: {failure}", file=sys.stderr)
            return 1
    print(f"wheel check: passed in {time.monotonic() - started:.0f} s")
    return 0


def _checkout_files() -> list[str]:
    """The checkout's files as a fresh clone of it would hold them: tracked, and new ones not
    ignored (so a module not yet added is checked too)."""
    try:
        listed = subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CheckFailed(f"listing the checkout needs git (git ls-files): {exc}") from exc
    # a file deleted in the working tree is still in the index
    return [path for path in listed.split("\0") if path and (ROOT / path).is_file()]


def _build(work: Path, files: list[str]) -> Path:
    source = work / "source"
    dist = work / "dist"
    with _step("build the sdist, then the wheel from it"):
        # From a copy: setuptools reads back an old egg-info's SOURCES.txt in the checkout (the
        # editable install writes one), which would put files the configuration misses into
        # the sdist; the copy also keeps in-place builds out and leaves the checkout untouched.
        for path in files:
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, source / path, follow_symlinks=False)
        # Without --sdist or --wheel, build makes the sdist and builds the wheel from it.
        _run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], cwd=work)
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        names = ", ".join(path.name for path in sorted(dist.iterdir()))
        raise CheckFailed(f"expected one sdist and one wheel, the build made: {names}")
    return wheels[0]


def _check_contents(wheel: Path, files: list[str], setuptools_config: dict[str, Any]) -> None:
    with _step("the wheel holds every file of the tree"):
        extensions = setuptools_config.get("ext-modules", [])
        with zipfile.ZipFile(wheel) as archive:
            shipped = {name for name in archive.namelist() if not name.endswith("/")}
        tree = _tree_files(files, setuptools_config["package-dir"])
        compiled_in = _compiled_in(extensions)

        problems = []
        missing = sorted(
            f"{in_wheel}  (from {path})"
            for in_wheel, path in tree.items()
            if in_wheel not in shipped and not _matches(path, compiled_in)
        )
        if missing:
            problems.append(_listing(f"missing from the wheel ({len(missing)})", missing))
        suffixes = importlib.machinery.EXTENSION_SUFFIXES
        compiled = set()
        for extension in extensions:
            stem = extension["name"].replace(".", "/")
            found = [stem + suffix for suffix in suffixes if stem + suffix in shipped]
            if not found:
                problems.append(f"no compiled module for the extension {extension['name']}")
            compiled.update(found)
        # the wheel's name starts with the distribution's name and version (PEP 427)
        metadata = "-".join(wheel.name.split("-")[:2]) + ".dist-info/"
        foreign = sorted(
            name for name in shipped - tree.keys() - compiled if not name.startswith(metadata)
        )
        if foreign:
            problems.append(_listing(f"in the wheel, not from the tree ({len(foreign)})", foreign))
        if problems:
            raise CheckFailed(f"{wheel.name}: " + "; ".join(problems))


def _tree_files(files: list[str], package_dir: dict[str, str]) -> dict[str, str]:
    """Each of ``files`` under a folder mapped into ``inferwire``, as the path it ships at in
    the wheel -> its path in the checkout."""
    in_wheel = {}
    for package, folder in package_dir.items():
        prefix = folder.rstrip("/") + "/"
        for path in files:
            if path.startswith(prefix):
                in_wheel[package.replace(".", "/") + "/" + path.removeprefix(prefix)] = path
    return in_wheel


def _compiled_in(extensions: Sequence[dict[str, Any]]) -> list[str]:
    """Patterns of the checkout paths that go into the compiled extensions and need not ship."""
    patterns = []
    for extension in extensions:
        patterns += extension.get("sources", []) + extension.get("depends", [])
        patterns += [folder.rstrip("/") + "/*" for folder in extension.get("include-dirs", [])]
    return patterns


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _check_base_install(work: Path, venv: Path, wheel: Path, extensions: list[str]) -> None:
    with _step("a fresh venv with the base dependencies only"):
        # no pip or setuptools in it to stand in for an undeclared dependency: this
        # interpreter's pip installs into it (and is newer, so quicker, than ensurepip's)
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
        _pip_install(work, venv, str(wheel))
    with _step("inferwire --help"):
        _run([str(venv / "bin" / "inferwire"), "--help"], cwd=work)
    with _step("import inferwire.codecs, round trip through protobuf and delta, extensions"):
        _run([str(venv / "bin" / "python"), "-c", "import inferwire.codecs"], cwd=work)
        _run([str(venv / "bin" / "python"), "-c", BASE_CHECK, *extensions], cwd=work)


def _check_bench_install(work: Path, venv: Path, wheel: Path) -> None:
    with _step("the bench extra"):
        _pip_install(work, venv, f"{wheel}[bench]")
    for command in ("bench", "load"):
        with _step(f"inferwire {command} --help"):
            _run([str(venv / "bin" / "inferwire"), command, "--help"], cwd=work)


def _pip_install(work: Path, venv: Path, requirement: str) -> None:
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    _run([*pip, "-c", str(CONSTRAINTS), requirement], cwd=work)


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    """Prints a check's name and how long it took; a failure inside it is named by it."""
    print(f"wheel check: {name} ...", flush=True)
    started = time.monotonic()
    try:
        yield
    except CheckFailed as failure:
        raise CheckFailed(f"[{name}] {failure}") from failure
    print(f"wheel check: {name}: ok ({time.monotonic() - started:.1f} s)", flush=True)


def _run(argv: list[str], *, cwd: Path) -> None:
    # a user's shell: no source tree on the path, nothing of the caller's venv
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    }
    completed = subprocess.run(
        argv,
        cwd=cwd,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        output = completed.stdout.rstrip().splitlines()[-OUTPUT_TAIL_LINES:]
        shown = [arg if "\n" not in arg else "<script>" for arg in argv]
        raise CheckFailed(
            f"`{' '.join(shown)}` exited with {completed.returncode}; its output ends:\n    "
            + "\n    ".join(output)
        )


def _listing(title: str, lines: list[str]) -> str:
    return title + ":\n    " + "\n    ".join(lines)


if __name__ == "__main__":
    sys.exit(main())
