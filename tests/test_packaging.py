"""The installable package: pyproject.toml in step with the Space's requirements files, every
third-party import declared, and a real install into a fresh virtual environment (reusing the
packages of the interpreter running the tests, so no download) that works from another folder."""

from __future__ import annotations

import ast
import os
import re
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SELF = canonicalize_name(PROJECT["name"])

#: import name -> distribution, where they differ
DISTRIBUTION = {"PIL": "pillow", "cv2": "opencv-python-headless"}
#: imports allowed outside sapiens2/ui without being a dependency: each is guarded where it is used
OPTIONAL = {
    "spaces": "sapiens2/zerogpu/entry.py uses it only on ZeroGPU (the app extra installs it)",
    "triton": "sapiens2/models/compile.py compiles with it only on a CUDA build of torch, which ships it",
    "ray": "sapiens2/batch/ray_engine.py imports it only for --engine ray (the ray extra installs it)",
    "onnx": "sapiens2/models/onnx_*.py import it only to export or read an .onnx file (the onnx extra)",
    "onnxruntime": "sapiens2/models/onnx_*.py import it only to run or quantise an .onnx file (the onnx extra)",
    "lancedb": "sapiens2/search/people_store.py imports it only for sapiens2 index / search (the search extra installs it)",
}


def read_requirements(path: Path) -> dict[str, Requirement]:
    """Requirement lines of a requirements file by canonical name (comments and -r lines skipped)."""
    out: dict[str, Requirement] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            out[canonicalize_name(req.name)] = req
    return out


def by_name(lines: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in lines]
    return {canonicalize_name(r.name): r for r in reqs if canonicalize_name(r.name) != SELF}


def runtime() -> dict[str, Requirement]:
    """The library's dependencies plus the app extra: what the Space needs."""
    return {**by_name(PROJECT["dependencies"]), **by_name(PROJECT["optional-dependencies"]["app"])}


def _pin(req: Requirement) -> str | None:
    specs = list(req.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


def test_requirements_txt_and_pyproject_name_the_same_packages() -> None:
    space, package = read_requirements(ROOT / "requirements.txt"), runtime()
    assert sorted(space) == sorted(package), "requirements.txt (the Space) and pyproject.toml differ"
    for name, req in space.items():
        other = package[name]
        assert req.extras == other.extras, f"{name}: extras {req.extras} vs {other.extras}"
        pin = _pin(req)
        if pin is not None:  # the Space pins exactly (torch); the library accepts a range holding it
            assert other.specifier.contains(pin, prereleases=True), f"{name}=={pin} outside {other.specifier}"
        else:
            assert req.specifier == other.specifier, f"{name}: {req.specifier} vs {other.specifier}"


def test_test_extra_matches_requirements_test_txt() -> None:
    text = (ROOT / "requirements-test.txt").read_text()
    assert "-r requirements.txt" in text  # the tests install the app's requirements too
    extra = PROJECT["optional-dependencies"]["test"]
    assert any(
        canonicalize_name(Requirement(e).name) == SELF and "app" in Requirement(e).extras for e in extra
    )
    listed = {n: str(r.specifier) for n, r in read_requirements(ROOT / "requirements-test.txt").items()}
    assert listed == {n: str(r.specifier) for n, r in by_name(extra).items()}


def test_ci_constraint_is_the_space_pin() -> None:
    """.ci/run swaps in the local CPU wheel through PIP_CONSTRAINT; the pin must stay the Space's."""
    ci = read_requirements(ROOT / ".ci" / "constraints.txt")
    assert str(ci["torch"].specifier) == str(read_requirements(ROOT / "requirements.txt")["torch"].specifier)
    assert runtime()["torch"].specifier.contains(_pin(ci["torch"]) or "")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "sapiens2"}


@pytest.mark.slow
def test_every_third_party_import_is_declared() -> None:
    """The library imports only its dependencies; only sapiens2/ui (the app) uses the app extra."""
    core = {canonicalize_name(n) for n in by_name(PROJECT["dependencies"])}
    # gradio brings its client and its web framework (FastAPI, on Starlette: the ASGI middleware of ui/arrival.py)
    app = core | {canonicalize_name(n) for n in runtime()} | {"gradio-client", "starlette"}
    for path in sorted((ROOT / "sapiens2").rglob("*.py")):
        allowed = app if "ui" in path.relative_to(ROOT / "sapiens2").parts[:1] else core
        for name in _imports(path) - set(OPTIONAL):
            dist = canonicalize_name(DISTRIBUTION.get(name, name))
            assert dist in allowed, f"{path.relative_to(ROOT)} imports {name}, not declared in pyproject.toml"


def test_package_data_covers_every_data_file() -> None:
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["sapiens2"]
    files = [p for p in (ROOT / "sapiens2").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert files, "sapiens2/data should hold the keypoint and class tables"
    for path in files:
        rel = path.relative_to(ROOT / "sapiens2")
        assert any(rel.match(g) for g in globs), f"{rel} would be missing from an installed package"


def test_console_script_is_the_module_entry() -> None:
    import sapiens2.__main__ as entry
    import sapiens2.cli as cli

    module, _, attr = PROJECT["scripts"]["sapiens2"].partition(":")
    assert module == "sapiens2.cli" and getattr(cli, attr) is cli.main
    assert entry.main is cli.main  # python -m sapiens2 runs the same command


def _site_dirs() -> list[str]:
    """This interpreter's package folders, in its own order: what the fresh venv must see.

    Not ``venv --system-site-packages``: from inside a venv (the README's flow: ``python -m venv``,
    then ``pip install -r requirements-test.txt``) that shows the *base* interpreter's packages,
    whose setuptools may lack ``bdist_wheel`` and which hold none of the test requirements."""
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if site.ENABLE_USER_SITE and user in sys.path:
        dirs.append(user)
    return [d for d in dirs if os.path.isdir(d)]


def _build_requirements_missing() -> list[str]:
    """pyproject's [build-system] requires that this interpreter does not meet (the install below
    builds without isolation, so it uses these very packages)."""
    from importlib.metadata import PackageNotFoundError, version

    missing = []
    for line in PYPROJECT["build-system"]["requires"]:
        req = Requirement(line)
        try:
            if not req.specifier.contains(version(req.name), prereleases=True):
                missing.append(f"{line} (found {version(req.name)})")
        except PackageNotFoundError:
            missing.append(f"{line} (not installed)")
    return missing


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``pip install`` of a copy of the source into a fresh venv that sees this interpreter's
    packages (a ``.pth`` file naming its site folders), without build isolation, index or
    dependencies: no download, a few seconds. Returns the venv's python, its ``sapiens2`` command
    and timings."""
    missing = _build_requirements_missing()
    assert not missing, f"the build needs {missing}: pip install -r requirements-test.txt installs them"
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"  # a copy: the build writes build/ and *.egg-info/ next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "sapiens2", src / "sapiens2", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp / "venv"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bindir / ("python.exe" if os.name == "nt" else "python")
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    # after the venv's own folder, so the installed copy is the one imported; addsitedir also
    # reads those folders' own .pth files, as a site folder's are
    lines = [f"import site; site.addsitedir({d!r})" for d in _site_dirs()]
    (Path(purelib) / "_this_interpreter.pth").write_text("\n".join(lines) + "\n")
    t1 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_CONSTRAINT")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", str(src)]
    done = subprocess.run(pip, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    t2 = time.perf_counter()
    away = tmp / "elsewhere"  # neither the repository nor the copy: only the installed package
    away.mkdir()
    return {"python": python, "script": bindir / "sapiens2", "env": env, "cwd": away, "src": src,
            "venv_s": t1 - t0, "install_s": t2 - t1}  # fmt: skip


def _run(installed: dict[str, object], *cmd: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd], cwd=installed["cwd"], env=installed["env"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.subprocess
def test_fresh_venv_import_works_from_another_folder(installed: dict[str, object]) -> None:
    code = (
        "import sys, json, sapiens2, sapiens2.cli as cli\n"
        "from sapiens2.data.metadata import KEYPOINT_NAMES, NUM_SEG_CLASSES\n"
        "cli.build_parser()\n"
        "from importlib.metadata import version\n"
        "print(json.dumps({'file': sapiens2.__file__, 'version': sapiens2.__version__,\n"
        "  'tables': [len(KEYPOINT_NAMES), NUM_SEG_CLASSES], 'gradio': 'gradio' in sys.modules,\n"
        "  'setuptools': version('setuptools')}))\n"
    )
    done = _run(installed, installed["python"], "-c", code)
    assert done.returncode == 0, done.stderr
    import json

    got = json.loads(done.stdout.strip().splitlines()[-1])
    site = Path(got["file"]).resolve()
    venv = Path(installed["python"]).parent.parent.resolve()
    assert venv in site.parents, f"imported {site}, not the installed copy"
    assert got["tables"] == [308, 29]  # the package data (keypoints308.json, seg29.json) came along
    assert got["version"] == __import__("sapiens2").__version__
    assert got["gradio"] is False  # the library and its command never need the app extra
    # the packages of the interpreter running the tests, not its base's (when it is a venv)
    from importlib.metadata import version

    assert got["setuptools"] == version("setuptools")


@pytest.mark.subprocess
def test_fresh_venv_console_script(installed: dict[str, object]) -> None:
    done = _run(installed, installed["script"], "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: sapiens2 ") and "pose" in done.stdout and "seg" in done.stdout
    same = _run(installed, installed["python"], "-m", "sapiens2", "pose", "--help")
    sub = _run(installed, installed["script"], "pose", "--help")
    assert sub.returncode == same.returncode == 0
    assert sub.stdout.startswith("usage: sapiens2 pose ") and same.stdout.startswith(
        "usage: python -m sapiens2 pose "
    )
    assert sub.stdout.split("\n\n", 1)[1] == same.stdout.split("\n\n", 1)[1]  # the same flags and help
    assert "--checkpoint" in sub.stdout and "--threshold" in sub.stdout
    bad = _run(installed, installed["script"], "pose", str(installed["cwd"] / "missing.jpg"))
    assert bad.returncode == 1 and "no such file or folder" in bad.stderr
    print(
        f"\nfresh venv: created in {installed['venv_s']:.2f} s, pip install in {installed['install_s']:.2f} s"
    )


def test_readme_keeps_two_set_up_commands_and_the_cpu_torch_note() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250  # the visitor's page; details live in docs/
    section = readme.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("\n", 1)[1].strip() for b in section.split("```")[1::2]]
    assert blocks == [
        # the app, and the package itself (the `sapiens2` command) without touching the pins
        "pip install -r requirements.txt && pip install --no-deps . && python app.py",
        "pip install -r requirements-test.txt && python -m pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text().split("verbatim:\n", 1)[1].splitlines()[0]
    assert ci.replace(" -q ", " ") == blocks[1]  # CI runs the README's test command (pip made quiet)
    pin = str(read_requirements(ROOT / "requirements.txt")["torch"].specifier)
    note = f"`pip install torch{pin} --index-url https://download.pytorch.org/whl/cpu`"
    assert note in section
    assert section.index(note) < section.index("```")  # read before the commands it changes
    assert re.search(r"about \d+ tests in about \d+ minutes", section)  # how long the test command takes


def test_readme_lists_albedo_with_your_own_checkpoint() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = [line for line in readme.splitlines() if line.startswith("| **Albedo**")]
    assert len(rows) == 1 and "your own checkpoint" in rows[0]
