#!/usr/bin/env bash
# Quick start, main job: set up, then run gpufleet on the simulated 8-GPU host (no GPU needed).
set -euo pipefail
source "$(dirname "$0")/setup-venv.sh"
inv gpu-clean --inventory hosts/rehearsal.yaml
inv status --inventory hosts/rehearsal.yaml
