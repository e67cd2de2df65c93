#!/usr/bin/env bash
# Builds .device/ for the GPU machine: ../shared/tools/device-bundle (Ray, Serve and what they need), then the
# project's own dependencies that the GPU machine's image lacks. Without them the engine does not import there
# (msgspec, pyzmq), and structured outputs (every GPU test's sampling parameters) need llguidance >= 1.9, whose
# wheels are tagged manylinux_2_31, a platform the shared tool does not ask for (it would fetch 1.6.1, which
# fails at engine start with "argument 'eos_token': 'list' object cannot be interpreted as an integer").
#   bash benchmarks/scripts/device_bundle.sh     # then carry [".device"] and run `bash .device/install.sh` first
# It also builds .devlite/: the same wheels without Ray (12 MB against 52), for single-GPU commands. Since the
# twelfth session the tracked tree (about 20 MB) and .device/ together pass the 64 MiB a device command carries:
# carry [".devlite", ...] and run `bash .devlite/install.sh` where Ray is not needed (engine, kernels, benches).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .device
printf 'msgspec>=0.18\npyzmq>=25\nnvidia-ml-py>=12\n' > .device/extra.txt
bash ../shared/tools/device-bundle
rm -f .device/whl/llguidance-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 -d .device/whl "llguidance>=1.9"
ls .device/whl | grep -E '^(msgspec|pyzmq|nvidia_ml_py|llguidance)-'
du -sh .device
mkdir -p .devlite/whl
grep -qx '/.devlite/' .git/info/exclude 2>/dev/null || echo '/.devlite/' >> .git/info/exclude
cp .device/whl/*.whl .devlite/whl/
rm -f .devlite/whl/grpcio-*.whl .devlite/whl/cryptography-*.whl  # Ray's alone
cat > .devlite/install.sh <<'SH'
#!/usr/bin/env bash
# The device bundle without Ray (single-GPU runs): the wheels the GPU machine's image lacks, into /tmp/site.
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$here"/whl/*.whl 2>&1 | grep -v -i warning || true
SH
du -sh .devlite
