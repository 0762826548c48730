# Sourced by .ci/lerobot and .ci/robosuite: what both need. Not a command.

# Headless MuJoCo through EGL; Mesa's shader cache out of $HOME.
export MUJOCO_GL=egl
export PYOPENGL_PLATFORM=egl
export MESA_SHADER_CACHE_DIR="${TMPDIR:-/tmp}/cosmos3-gym-mesa-cache"

# venvs_only "$@": true for `--venvs-only` (build the venvs, run nothing: .ci/run builds them
# while the main suite runs), false for no argument; anything else is refused.
venvs_only() {
    case "$#:${1:-}" in
        1:--venvs-only) return 0 ;;
        0:) return 1 ;;
        *) echo "usage: $0 [--venvs-only]; found: $*" >&2; exit 2 ;;
    esac
}

# The key a venv is built for: this checkout's place (its editable installs point here, as
# scripts/dev.py's stamp records), its pyproject.toml files and the script building it. A venv
# whose stamp holds it is not installed into again; one shared with another checkout is.
venv_key() {
    { pwd; cat pyproject.toml plugins/*/pyproject.toml "$1"; } | sha256sum | cut -d' ' -f1
}

# venv_ready VENV SCRIPT: whether VENV was built, completely, for this checkout by SCRIPT.
venv_ready() {
    [ -x "$1/bin/python" ] && [ "$(cat "$1/.ci-built" 2>/dev/null)" = "$(venv_key "$2")" ]
}

# mark_venv_ready VENV SCRIPT: written after VENV's last install succeeded, never before.
mark_venv_ready() {
    venv_key "$2" > "$1/.ci-built"
}

# all_ran VENV REPORT LABEL: fails unless the pytest JUnit REPORT collected tests and skipped none.
all_ran() {
    "$1/bin/python" - "$2" "$3" <<'PYEOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
tests, skipped = int(suite.get("tests")), int(suite.get("skipped"))
if tests == 0 or skipped:
    sys.exit(f"{sys.argv[2]}: {tests} tests collected, {skipped} skipped; all must run")
print(f"{sys.argv[2]}: all {tests} tests ran")
PYEOF
}
