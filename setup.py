"""The packages of the distribution, found from the folders rather than listed by hand.

pyproject.toml maps each top-level folder under the ``inferwire`` namespace (``package-dir``:
``codecs`` is a standard-library module, so the folders cannot be top-level packages), and
setuptools' own discovery does not follow such a mapping. Every folder with an ``__init__.py``
under a mapped folder is a package here, so a new module or subpackage cannot be left out of the
wheel; a folder without one (the vendored valgrind headers, data) is not.
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup


def _packages() -> list[str]:
    pyproject = tomllib.loads(Path(__file__).with_name("pyproject.toml").read_text())
    found = []
    for name, folder in pyproject["tool"]["setuptools"]["package-dir"].items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(folder)]
    return sorted(found)


setup(packages=_packages())
