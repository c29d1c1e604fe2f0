"""The conda environment, pyproject, README and CI stay in step."""
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _pip_list(env: dict) -> list[str]:
    for dep in env["dependencies"]:
        if isinstance(dep, dict) and "pip" in dep:
            return dep["pip"]
    raise AssertionError("environment.yml has no pip section")


def test_environment_yml_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    expected = project["dependencies"] + project["optional-dependencies"]["cpu"] + ["-e ."]
    assert _pip_list(env) == expected


def test_environment_yml_has_python_and_pip():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    plain = [d for d in env["dependencies"] if isinstance(d, str)]
    assert "pip" in plain and any(d.startswith("python") for d in plain)


def test_readme_names_the_two_commands():
    assert README.exists(), "README.md is missing"
    readme = README.read_text()
    assert "make test" in readme
    assert "make quickstart" in readme


def test_makefile_has_the_two_targets():
    makefile = (ROOT / "Makefile").read_text()
    assert "\ntest:" in makefile and "\nquickstart:" in makefile


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
