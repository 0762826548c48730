"""What a simulator needs before it runs, checked when its env family is made (before the model
loads): its package, installed by one of this project's extras, and a renderer that starts
where it will render.

Without these checks a missing package surfaced as a traceback from the first task lookup
(LIBERO) or as an env fault in every worker, retried until the run gave up (Meta-World), and a
MuJoCo that cannot open a GL context (no display and no ``MUJOCO_GL=egl``, or no EGL library)
faulted or aborted the same way. Each is one ``ValueError`` here that names the fix.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

# One frame of a one-geom scene, rendered as the simulators render theirs (MUJOCO_GL picks the
# backend: glfw needs a display, egl the EGL library, osmesa OSMesa). Opening a context is not
# enough: glfw without a display only warns, and the first render fails.
_RENDER_PROBE = """
import mujoco
model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='1'/></worldbody></mujoco>")
renderer = mujoco.Renderer(model, 8, 8)
renderer.update_scene(mujoco.MjData(model))
renderer.render()
renderer.close()
"""

RENDER_FIX = ("on a machine without a display set MUJOCO_GL=egl (it needs the EGL library: "
              "apt-get install libegl1; on a GPU the driver's) or MUJOCO_GL=osmesa (apt-get "
              "install libosmesa6), then rerun")


def require_package(module: str, *, env: str, extra: str) -> None:
    """A ``ValueError`` naming the extra to install where ``module`` cannot be found.

    >>> require_package("json", env="demo", extra="demo")
    >>> try:
    ...     require_package("no_such_simulator", env="demo", extra="demo")
    ... except ValueError as err:
    ...     print(str(err).split(" (")[0])
    --env demo needs the no_such_simulator package, which is not installed: pip install -e '.[demo]'
    """
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"--env {env} needs the {module} package, which is not installed: "
                         f"pip install -e '.[{extra}]' (from a clone of cosmos3-gym), then rerun")


def require_mujoco_rendering(env: str, *, backend: str | None = None) -> None:
    """A ``ValueError`` naming the fix where MuJoCo cannot render with ``backend`` (default:
    ``MUJOCO_GL`` as set; unset is MuJoCo's own default, glfw, which needs a display). The
    frame is rendered in a child process, once per backend and process: a context opened here
    would not survive the fork of an env worker, and a failing backend may abort."""
    gl = backend if backend is not None else os.environ.get("MUJOCO_GL")
    problem = _render_problem(gl)
    if problem is not None:
        how = (f"its {backend} renderer" if backend is not None else
               f"MUJOCO_GL={gl}" if gl else "MUJOCO_GL unset, so glfw, which needs a display")
        raise ValueError(f"--env {env}: MuJoCo cannot render here ({how}: {problem}); "
                         f"{RENDER_FIX}")


@functools.cache
def _render_problem(backend: str | None) -> str | None:
    """What went wrong opening a GL context with ``backend`` (None: it opened)."""
    env = dict(os.environ)
    env.pop("MUJOCO_GL", None)
    if backend:
        env["MUJOCO_GL"] = backend
        if backend in ("egl", "osmesa"):
            env["PYOPENGL_PLATFORM"] = backend
    try:
        done = subprocess.run([sys.executable, "-c", _RENDER_PROBE], env=env, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "opening a GL context took over 120 s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"the probe exited with status {done.returncode}"
