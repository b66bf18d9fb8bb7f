# Shared by scripts/serve and scripts/test: create .venv and install the
# project (with the dev extra when asked), only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
extra="${SETUP_EXTRA:-}"  # not $1: a sourced script sees its caller's arguments
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$PYTHON" --version)" >&2
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed${extra:+-$extra}"
# Reinstalled when the package's definition changes (pyproject.toml, setup.py) or a source of the
# compiled data plane does (the digest its build is stamped with, from the module list in
# gateway/_compiled.py, loaded by path: the venv may not have the package yet): pip install -e
# compiles them in place again.
sources="$("$PYTHON" -c 'import importlib.util as u
spec = u.spec_from_file_location("compiled", "gateway/_compiled.py")
module = u.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.source_digest())')"
want="$( { cat pyproject.toml setup.py gateway/_compiled.py; echo "$sources"; } | sha256sum | cut -d' ' -f1)"

# apt_install COMMAND PACKAGE: install PACKAGE with apt when COMMAND is missing (apt-get update once).
_apt_updated=""
apt_install() {
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "setup: installing $2 (apt)" >&2
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    if [ -z "$_apt_updated" ]; then
        $sudo apt-get update -qq >&2
        _apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >&2
}

if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    started=$SECONDS
    echo "setup: upgrading pip" >&2
    .venv/bin/python -m pip install --quiet --upgrade pip >&2
    echo "setup: installing sandbox-gateway${extra:+[$extra]} and its dependencies into .venv and compiling" \
         "its data plane (a few minutes the first time; without a C compiler it runs as pure Python)" >&2
    # The C compile goes through ccache when it is installed (the dev setup, so CI, installs it), whose
    # cache (~/.cache/ccache) outlives the checkout; Cython keeps its translations in ~/.cython (setup.py).
    # Both are keyed on the sources, the compiler and its options: a changed source is compiled again.
    [ "$extra" = dev ] && { apt_install ccache ccache || true; }
    ccache=()
    [ -d /usr/lib/ccache ] && ccache=(env PATH="/usr/lib/ccache:$PATH" CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1)
    "${ccache[@]}" .venv/bin/python -m pip install --quiet -e ".${extra:+[$extra]}" >&2
    echo "$want" > "$stamp"
    echo "setup: done in $((SECONDS - started)) s; the CLI is .venv/bin/sandbox-gateway" \
         "(source .venv/bin/activate to have sandbox-gateway on PATH)" >&2
fi
