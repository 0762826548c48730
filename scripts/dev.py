"""The README's commands, with all their set-up: ``demo``, ``test`` and ``docs`` (stdlib only).

    python3 scripts/dev.py demo     # what `make demo` runs
    python3 scripts/dev.py test     # what `make test` and CI (.ci/run) run; args go to pytest
    python3 scripts/dev.py docs     # what `make docs` runs: the site, built strictly (CI too)
    python3 scripts/dev.py setup    # the set-up alone, for test and docs together (CI's first
                                    # step: nothing installs into the checkout after it)

Each command first makes sure the environment is ready, then runs:

1. ``VENV`` (default ``.venv``) is created with the Python running this script if it is missing.
2. torch is installed unless the environment already has one (a torch you installed yourself is
   kept): from ``TORCH_INDEX_URL`` if set; else PyTorch's CUDA build where ``nvidia-smi`` sees a
   GPU (the ordinary package index serves it), PyTorch's CPU build from its own CPU wheel index
   elsewhere. Where that index cannot be reached, torch comes from the ordinary package index
   instead, and one line says so.
3. The project is installed in editable mode with the command's extras.
4. A stamp file in the environment records the ``pyproject.toml`` it was installed from and the
   extras, written only after every step succeeded. A rerun with a matching stamp installs
   nothing; a changed ``pyproject.toml`` or a new extra installs again (keeping torch).

A failed step stops with one ``error:`` line naming the step and what to do; the stamp is not
written, so the next run retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The torch release CI and the README are checked with. Pinned on both routes (CPU index or
# ordinary index) so both give the same release: an unpinned `torch` resolves to the newest one,
# which on Linux x86-64 from the ordinary index is a multi-GB CUDA build, and which no machine has
# pre-staged. Any torch in the project's range (pyproject.toml) works if you bring your own.
TORCH_VERSION = "2.13.0"
CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"
STAMP_NAME = "cosmos3-gym-setup.json"
# pip 21.3 is the first to install a pyproject.toml-only project in editable mode (PEP 660).
MIN_PIP = "21.3"
# What LIBERO needs to render headless (MuJoCo through EGL; Mesa's shader cache out of $HOME).
LIBERO_ENV = {
    "MUJOCO_GL": "egl",
    "PYOPENGL_PLATFORM": "egl",
    "MESA_SHADER_CACHE_DIR": os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "cosmos3-gym-mesa-cache"
    ),
}
DEMO_OUT = Path("runs/demo")
DEMO_EVAL = ["eval", "--trials", "5", "--num-envs", "4", "--videos", "--out", str(DEMO_OUT)]
# The same evaluation's first trial per task again, with videos of what the model imagined.
DEMO_IMAGINED_OUT = Path("runs/demo_imagined")
DEMO_IMAGINED = ["eval", "--trials", "1", "--num-envs", "4", "--videos", "imagined",
                 "--out", str(DEMO_IMAGINED_OUT)]
# The demo draws results.png (matplotlib); imagined videos are GIFs unless imageio-ffmpeg is there.
DEMO_EXTRAS = {"plot"}
TEST_EXTRAS = {"test", "libero", "metaworld", "gym", "rl"}
DOCS_EXTRAS = {"docs"}
# Top-level folders installed as subpackages of cosmos3_gym (pyproject.toml, package-dir).
DOCS_SUBPACKAGES = ("envs", "eval", "bench", "train")
# Installed without its dependencies after the gym extra: its own pin mujoco<3.9 would break
# LIBERO, and it runs on the MuJoCo the extras hold (pyproject.toml, the gym extra).
NO_DEPS = {"gym": ["gym-aloha==0.1.5"]}


class StepFailed(Exception):
    """A set-up step failed; the message says which and what to do."""


def say(line: str) -> None:
    print(line, flush=True)


class Environment:
    """The virtual environment this script installs into and runs from."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin_dir = path / ("Scripts" if os.name == "nt" else "bin")
        self.python = self.script("python")
        self.stamp = path / STAMP_NAME
        # For messages: relative to the checkout when inside it.
        self.name = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)

    def script(self, name: str) -> Path:
        return self.bin_dir / (f"{name}.exe" if os.name == "nt" else name)

    def run(self, *args: str, env: dict[str, str] | None = None) -> int:
        return subprocess.run([str(self.python), *args], cwd=ROOT, env=env).returncode

    def output(self, *args: str) -> str | None:
        """stdout of a Python call in the environment, or None when it fails."""
        done = subprocess.run(
            [str(self.python), *args], cwd=ROOT, capture_output=True, text=True
        )
        return done.stdout.strip() if done.returncode == 0 else None

    def installed_version(self, distribution: str) -> str | None:
        return self.output(
            "-c", f"import importlib.metadata as m; print(m.version({distribution!r}))"
        )


def stamp_key(extras: set[str]) -> dict[str, object]:
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    return {
        "pyproject_sha256": hashlib.sha256(pyproject).hexdigest(),
        # An editable install points at this checkout; a moved checkout installs again.
        "root": str(ROOT),
        "extras": sorted(extras),
    }


def read_stamp(venv: Environment) -> dict[str, object] | None:
    try:
        return json.loads(venv.stamp.read_text())
    except (OSError, ValueError):
        return None


def up_to_date(venv: Environment, extras: set[str]) -> bool:
    stamp = read_stamp(venv)
    if stamp is None or not venv.python.exists():
        return False
    key = stamp_key(extras)
    return (
        stamp.get("pyproject_sha256") == key["pyproject_sha256"]
        and stamp.get("root") == key["root"]
        and extras <= set(stamp.get("extras", []))
    )


def gpu_name() -> str | None:
    """The first GPU ``nvidia-smi -L`` lists, or None (no nvidia-smi, or it fails: no driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line.split(" (UUID")[0] for line in done.stdout.splitlines() if line.startswith("GPU ")]
    return gpus[0] if done.returncode == 0 and gpus else None


def index_unreachable(url: str) -> str | None:
    """Why ``url`` cannot be reached (DNS, refused, timeout), or None when a server answers."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15)
    except urllib.error.HTTPError:
        return None  # a server answered; pip will say what it thinks of the answer
    except urllib.error.URLError as err:
        reason = err.reason
        if "CERTIFICATE" in str(reason).upper():
            return None  # a TLS-intercepting proxy: pip has its own certificate settings
        return str(getattr(reason, "strerror", None) or reason)
    except (OSError, ValueError) as err:
        return str(err)
    return None


def pip_install(venv: Environment, step: str, *args: str, hint: str) -> None:
    code = venv.run("-m", "pip", "install", "-q", *args)
    if code != 0:
        raise StepFailed(f"step '{step}' failed (pip exit code {code}; its error is above). {hint}")


def create_environment(venv: Environment) -> None:
    if venv.python.exists():
        return
    if venv.path.exists():
        raise StepFailed(
            f"step 'create the environment' failed: {venv.name} exists but holds no "
            f"{venv.python.relative_to(venv.path)}. Remove it, or set VENV to another folder, "
            "and rerun."
        )
    say(f"==> creating the environment {venv.name} ({sys.executable}, "
        f"Python {sys.version.split()[0]})")
    code = subprocess.run([sys.executable, "-m", "venv", str(venv.path)]).returncode
    if code != 0 or not venv.python.exists():
        shutil.rmtree(venv.path, ignore_errors=True)
        raise StepFailed(
            "step 'create the environment' failed (python -m venv; its error is above). "
            "On Debian/Ubuntu the venv module is a separate package: apt install python3-venv, "
            "then rerun."
        )


def install_torch(venv: Environment, gpu: str | None) -> None:
    step = "install torch"
    present = venv.installed_version("torch")
    if present is not None:
        say(f"==> torch {present} is already in {venv.name}; keeping it")
        return
    spec = f"torch=={TORCH_VERSION}"
    index = os.environ.get("TORCH_INDEX_URL", "").strip()
    if index:
        say(f"==> installing {spec} from TORCH_INDEX_URL={index}")
        pip_install(venv, step, spec, "--index-url", index,
                    hint="Check TORCH_INDEX_URL (unset it for the default choice) and rerun.")
        return
    if gpu is not None:
        say(f"==> {gpu}: installing {spec}, PyTorch's CUDA build, from the package index "
            "(a few GB)")
        pip_install(venv, step, spec,
                    hint="For another CUDA version set TORCH_INDEX_URL (e.g. "
                         "https://download.pytorch.org/whl/cu128) and rerun.")
        return
    why = index_unreachable(CPU_INDEX_URL)
    if why is None:
        say(f"==> no GPU (nvidia-smi): installing {spec}, the CPU build, from {CPU_INDEX_URL}")
        pip_install(venv, step, spec, "--index-url", CPU_INDEX_URL,
                    hint="Set TORCH_INDEX_URL to a reachable index that serves torch, or install "
                         f"torch into {venv.name} yourself, and rerun.")
        return
    say(f"==> fallback: {CPU_INDEX_URL} is unreachable ({why}), so {spec} comes from the "
        "ordinary package index (there a CPU build only if that index serves one; PyPI's "
        "Linux x86-64 wheel is the CUDA build)")
    pip_install(venv, step, spec,
                hint="Set TORCH_INDEX_URL to a reachable index that serves torch, or install "
                     f"torch into {venv.name} yourself, and rerun.")


def check_environment(venv: Environment, gpu: str | None) -> None:
    probe = ("import torch, cosmos3_gym; "
             "print(torch.__version__, torch.version.cuda or 'none', torch.cuda.is_available())")
    found = venv.output("-c", probe)
    if found is None:
        raise StepFailed(
            f"step 'check the install' failed: torch or cosmos3_gym does not import in "
            f"{venv.name}. Remove {venv.name} and rerun."
        )
    version, cuda, cuda_works = found.split()
    build = "CPU build" if cuda == "none" else f"CUDA {cuda} build"
    say(f"==> ready: torch {version} ({build}; GPU in use: {cuda_works == 'True'})")
    if gpu is not None and cuda_works != "True":
        say(f"warning: nvidia-smi sees a GPU but torch {version} cannot use it; for a CUDA build "
            f"remove {venv.name} and rerun with TORCH_INDEX_URL set to the CUDA index that fits "
            "your driver (e.g. https://download.pytorch.org/whl/cu128)")


def set_up(venv: Environment, extras: set[str]) -> None:
    """Make ``venv`` hold the project with ``extras``; a no-op when its stamp says so."""
    if up_to_date(venv, extras):
        say(f"==> {venv.name} is up to date with pyproject.toml; nothing to install")
        return
    create_environment(venv)
    stamp = read_stamp(venv)
    if stamp is not None:
        # Keep what the environment already had: a rerun of the other command then needs nothing.
        extras = extras | set(stamp.get("extras", []))
    venv.stamp.unlink(missing_ok=True)
    key = stamp_key(extras)  # what is about to be installed, recorded once all of it is
    pip_install(venv, "update pip", f"pip>={MIN_PIP}",
                hint="pip could not reach the package index; check the network and rerun.")
    gpu = gpu_name()
    install_torch(venv, gpu)
    target = f".[{','.join(sorted(extras))}]" if extras else "."
    say(f"==> installing the project: pip install -e \"{target}\"")
    pip_install(venv, "install the project", "-e", target,
                hint="Fix what pip reports and rerun; what is installed already is kept.")
    for extra in sorted(extras & set(NO_DEPS)):
        say(f"==> installing {', '.join(NO_DEPS[extra])} without dependencies ({extra} extra)")
        pip_install(venv, f"install the {extra} extra's packages", "--no-deps", *NO_DEPS[extra],
                    hint="Fix what pip reports and rerun.")
    check_environment(venv, gpu)
    venv.stamp.write_text(json.dumps(key, indent=2) + "\n")


def demo(venv: Environment, args: list[str]) -> int:
    if args:
        raise SystemExit("dev.py demo: error: takes no arguments (run cosmos3-gym eval yourself "
                         "for another evaluation)")
    set_up(venv, DEMO_EXTRAS)
    for run, out in ((DEMO_EVAL, DEMO_OUT), (DEMO_IMAGINED, DEMO_IMAGINED_OUT)):
        if (ROOT / out).exists():
            # A rerun shows the demo again rather than resuming the finished run.
            say(f"==> replacing the previous demo's {out}")
            shutil.rmtree(ROOT / out)
        say(f"==> cosmos3-gym {' '.join(run)}")
        code = subprocess.run([str(venv.script("cosmos3-gym")), *run], cwd=ROOT).returncode
        if code != 0:
            return code
        videos = sorted(p for p in (ROOT / out / "videos").iterdir() if p.is_file())
        plots = [p.name for p in (ROOT / out).glob("results.png")]
        say(f"==> {len(videos)} episode videos in {out / 'videos'}"
            + (f", {plots[0]} in {out}" if plots else ""))
    return 0


def pytest_workers(args: list[str], cores: int) -> list[str]:
    """pytest-xdist's options for the suite: two processes where there are two cores, each test
    file whole on one of them and in its own order (``--dist loadfile``: a module's fixtures
    are built once, as in one process). Most tests keep one core busy, so two halve the suite's
    time on CI's two cores. Options of xdist's own among ``args`` decide instead.

    >>> pytest_workers([], 2), pytest_workers([], 1), pytest_workers(["-n", "4"], 2)
    (['-n', '2', '--dist', 'loadfile'], [], [])
    >>> pytest_workers(["-p", "no:xdist"], 2), pytest_workers(["--numprocesses=3"], 8)
    ([], [])
    """
    own = ("-n", "--numprocesses", "--dist", "--maxprocesses")
    if cores < 2 or "no:xdist" in args or any(a.startswith(own) for a in args):
        return []
    return ["-n", "2", "--dist", "loadfile"]


def test(venv: Environment, args: list[str]) -> int:
    set_up(venv, TEST_EXTRAS)
    env = dict(os.environ)
    for name, value in LIBERO_ENV.items():
        env.setdefault(name, value)
    # The LIBERO extra was just installed: a LIBERO that cannot be imported is a failure, not a
    # reason to skip its tests (tests/conftest.py).
    env.setdefault("COSMOS3_GYM_REQUIRE_LIBERO", "1")
    env.setdefault("COSMOS3_GYM_REQUIRE_METAWORLD", "1")
    env.setdefault("COSMOS3_GYM_REQUIRE_GYM", "1")
    say("==> ruff check .")
    code = venv.run("-m", "ruff", "check", ".", env=env)
    if code != 0:
        return code
    # The whole suite, slow tests included (a plain pytest leaves them out: pyproject.toml's
    # addopts). pytest keeps the last -m it is given, so a -m among args selects instead.
    pytest = ["-q", "-m", "slow or not slow", *pytest_workers(args, os.cpu_count() or 1), *args]
    say(f"==> python -m pytest {shlex.join(pytest)}")
    return venv.run("-m", "pytest", *pytest, env=env)


def stage_sources(target: Path) -> None:
    """The package as it installs, as a tree of links under ``target``, for the API reference:
    ``envs/``, ``eval/``, ``bench/`` and ``train/`` become ``cosmos3_gym/envs``, ... as
    pyproject.toml's package-dir maps them, so the reference reads the source without importing
    it."""
    if target.exists():
        shutil.rmtree(target)
    package = target / "cosmos3_gym"
    package.mkdir(parents=True)
    for entry in sorted((ROOT / "cosmos3_gym").iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name in DOCS_SUBPACKAGES:
        (package / name).symlink_to(ROOT / name)


def docs(venv: Environment, args: list[str]) -> int:
    if args:
        raise SystemExit("dev.py docs: error: takes no arguments")
    set_up(venv, DOCS_EXTRAS)
    stage_sources(ROOT / "build" / "docs-src")
    say("==> mkdocs build --strict (a broken link, anchor or reference fails it)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's banner about its successor
    code = venv.run("-m", "mkdocs", "build", "--strict", "--config-file",
                    str(ROOT / "mkdocs.yml"), env=env)
    if code == 0:
        say(f"==> the site is in {ROOT / 'build' / 'site'} (open index.html)")
    return code


def setup(venv: Environment, args: list[str]) -> int:
    """The environment `test` and `docs` both need, and nothing run. CI calls it first: the
    other venvs it builds meanwhile (.ci/run) install this checkout too, and two editable
    installs at once would race on its ``cosmos3_gym.egg-info``."""
    if args:
        raise SystemExit("dev.py setup: error: takes no arguments")
    set_up(venv, TEST_EXTRAS | DOCS_EXTRAS)
    return 0


COMMANDS = {"demo": demo, "test": test, "docs": docs, "setup": setup}


def main(argv: list[str]) -> int:
    # This script runs under whatever `python3` is; the project itself needs 3.10.
    if sys.version_info < (3, 10):  # noqa: UP036
        say(f"error: cosmos3-gym needs Python 3.10 or newer; {sys.executable} is "
            f"{sys.version.split()[0]}")
        return 2
    if not argv or argv[0] not in COMMANDS:
        say(f"usage: python3 scripts/dev.py {{{','.join(COMMANDS)}}} [pytest args for test]")
        return 2
    venv = Environment(ROOT / os.environ.get("VENV", ".venv"))
    try:
        return COMMANDS[argv[0]](venv, argv[1:])
    except StepFailed as err:
        say(f"error: {err}")
        return 1
    except KeyboardInterrupt:
        say("interrupted; rerun the same command to carry on")
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
