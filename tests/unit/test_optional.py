"""require(): an integration's framework imported, or an ImportError that names the extra."""

from __future__ import annotations

import pathlib
import sys

import pytest
import tomllib

from ray_ckpt import _optional

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_an_installed_module_is_returned() -> None:
    assert _optional.require("json.decoder", "torchdata") is sys.modules["json.decoder"]


@pytest.mark.parametrize("module", ["ray_ckpt_no_such_framework", "ray_ckpt_no_such_framework.sub.mod"])
def test_a_missing_framework_names_the_extra_to_install(module: str) -> None:
    with pytest.raises(ImportError) as raised:
        _optional.require(module, "transformers")
    assert 'pip install "ray_ckpt[transformers]"' in str(raised.value)
    assert raised.value.name == "ray_ckpt_no_such_framework"


def test_a_framework_that_fails_on_its_own_missing_dependency_raises_its_own_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ray_ckpt_fake_framework.py").write_text("import ray_ckpt_fake_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as raised:
        _optional.require("ray_ckpt_fake_framework", "lightning")
    assert raised.value.name == "ray_ckpt_fake_dependency" and "ray_ckpt[" not in str(raised.value)


def test_an_unknown_extra_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown extra 'jax'"):
        _optional.require("json", "jax")


def test_every_extra_is_declared_in_pyproject_and_none_is_a_core_requirement() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    for extra in _optional.EXTRAS:
        assert [r for r in extras[extra] if r.startswith(extra)], extra
        assert not [r for r in project["dependencies"] if r.startswith(extra)], extra
    assert set(_optional.EXTRAS) <= {name for r in extras["all"] for name in r.split("[")[1].rstrip("]").split(",")}
