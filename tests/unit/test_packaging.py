"""pyproject.toml declares every folder of the package and every data file in it, so a wheel
holds the dashboard's page, the Grafana dashboard and the C source, and a build warns of no
folder left out."""

from __future__ import annotations

import fnmatch
import pathlib

import tomllib
from setuptools import find_namespace_packages

ROOT = pathlib.Path(__file__).resolve().parents[2]
SKIP = {"__pycache__"}


def setuptools_config() -> dict[str, object]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"])


def folders() -> dict[str, pathlib.Path]:
    """Every folder of the package (installed dotted name -> path), data-only ones included:
    ray_ckpt/ and actors/, which installs as ray_ckpt.actors."""
    found = {}
    for top, name in (("ray_ckpt", "ray_ckpt"), ("actors", "ray_ckpt.actors")):
        for path in [ROOT / top, *(ROOT / top).rglob("*")]:
            if path.is_dir() and not SKIP & set(path.relative_to(ROOT).parts):
                found[".".join([name, *path.relative_to(ROOT / top).parts])] = path
    return found


def test_every_folder_is_a_package_the_build_installs() -> None:
    config = setuptools_config()
    packages: list[str] = config["packages"]  # type: ignore[assignment]
    assert sorted(packages) == sorted(folders())
    assert config["package-dir"] == {"ray_ckpt.actors": "actors"}
    # ray_ckpt's own folders as the build would find them (no folder of it escapes the list)
    found = find_namespace_packages(str(ROOT), include=["ray_ckpt", "ray_ckpt.*"], exclude=["*.__pycache__"])
    assert set(found) <= set(packages)


def test_every_data_file_is_package_data() -> None:
    data: dict[str, list[str]] = setuptools_config()["package-data"]  # type: ignore[assignment]
    missing = []
    for name, path in folders().items():
        for file in path.iterdir():
            if file.is_dir() or file.suffix in (".py", ".pyc", ".so"):
                continue
            if not any(fnmatch.fnmatch(file.name, pattern) for pattern in data.get(name, [])):
                missing.append(str(file.relative_to(ROOT)))
    assert missing == []
