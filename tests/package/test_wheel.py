"""The built wheel: it holds the package (with py.typed) and no tests, and installed in a
fresh virtual environment, ``import ember`` works, a tiny model trains, ``ember --help`` runs.

The fresh environment sees this interpreter's site-packages through a ``.pth`` file, so
ember's dependencies (numpy, pydantic, ...) need no download; ember itself comes only
from the wheel (the checkout's ``src`` is not on its path, and an editable install's
hook is not run from a ``.pth``-added folder).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TRAIN_ONE_STEP = textwrap.dedent("""
    import ember
    from ember import Tensor

    device = ember.device("ndarray").autodiff()
    ember.seed(device, 0)
    model = ember.nn.LinearConfig(3, 1).init(device)
    optimizer = ember.optim.SgdConfig().init()
    x = Tensor.from_data([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], device)
    y = Tensor.from_data([[1.0], [0.0]], device)

    def loss(m):
        return ((m(x) - y) ** 2).mean()

    before = loss(model)
    model = optimizer.step(0.05, model, ember.optim.GradientsParams.from_grads(
        before.backward(), model))
    print(ember.__file__)
    print(before.item() > loss(model).item())
""")


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env,
                          check=False, **kwargs)  # fmt: skip
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done


def _can_build_wheels() -> bool:
    """Whether this environment's setuptools builds wheels by itself."""
    try:
        import setuptools
    except ImportError:
        return False
    major_minor = tuple(int(part) for part in setuptools.__version__.split(".")[:2])
    return major_minor >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of the checkout (what a clean clone has, tests included), so that the build's
    # build/ and egg-info stay out of the checkout and no earlier build's files leak in.
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"))
    # Without build isolation where this environment can build wheels (setuptools 70.1+
    # has bdist_wheel; older ones need the wheel package), so nothing is downloaded;
    # else pip fetches the build requirements. --no-deps: only ember's own wheel.
    isolation = ["--no-build-isolation"] if _can_build_wheels() else []
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", *isolation,
         "--disable-pip-version-check", "--quiet", "--wheel-dir", str(out)])  # fmt: skip
    wheels = list(out.glob("ember-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_holds_the_typed_package_and_no_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"ember"}
    assert "ember/py.typed" in names
    assert "ember/train/tracker/mlflow_tracker.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith(("tests/", "benchmarks/"))]
    assert not [n for n in names if n.endswith((".pyc", ".so"))]
    metadata = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "ember = ember.cli:main" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_the_wheel_installs_into_a_fresh_venv_and_works(wheel: Path, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    # This interpreter's packages (ember's dependencies), after the fresh env's own: its
    # site-packages folders, not the checkout's src.
    sites = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (Path(purelib.stdout.strip()) / "deps.pth").write_text("\n".join(sites) + "\n")
    # --ignore-installed: the editable ember of this environment, visible through the
    # .pth, is neither uninstalled nor counted as installed.
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--ignore-installed", "--no-index", "--disable-pip-version-check", "--quiet",
         str(wheel)])  # fmt: skip

    done = run([str(python), "-c", TRAIN_ONE_STEP], cwd=tmp_path)
    location, improved = done.stdout.split()
    assert Path(location).is_relative_to(env), location  # the wheel's ember, not src/
    assert improved == "True"

    done = run([str(env / "bin" / "ember"), "--help"], cwd=tmp_path)
    assert done.stdout.startswith("usage: ember") and "guide" in done.stdout
