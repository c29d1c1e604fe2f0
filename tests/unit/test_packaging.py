"""The conda environment, pyproject, README and CI stay in step."""
import re
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
    extras = project["optional-dependencies"]
    expected = project["dependencies"] + extras["test"] + extras["cpu"] + extras["real"] + extras["ray"] + ["-e ."]
    assert _pip_list(env) == expected


def test_environment_yml_has_python_and_pip():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    plain = [d for d in env["dependencies"] if isinstance(d, str)]
    assert "pip" in plain and any(d.startswith("python") for d in plain)


def test_every_make_command_the_readme_names_is_a_makefile_target():
    named = set(re.findall(r"(?:`|^|&& )make ([a-z][\w-]*)", README.read_text(), re.MULTILINE))  # commands, not prose
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert {"test", "quickstart"} <= named, "the README gives the two commands"
    assert named <= targets, f"the README names targets the Makefile lacks: {sorted(named - targets)}"


def test_ci_runs_the_readmes_test_command():
    ci_commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                   if line.strip() and not line.lstrip().startswith(("#", "set ", "cd ", "export "))]
    assert ci_commands == ["make test"]


def test_every_test_module_has_a_name_of_its_own():
    """The test folders are not packages: pytest imports each module by its file name, so two of one name in
    different folders stop the whole run at collection (a clean clone's make test did)."""
    names = [path.name for path in (ROOT / "tests").glob("*/test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
