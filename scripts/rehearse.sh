#!/usr/bin/env bash
# Quick start, main job: set up, then rehearse the seeds' experiment (baseline vs EAGLE-3 at
# C=1,10,64) on a simulated 8-GPU host: gpu-clean -> launch -> bench -> stop -> compare.
set -euo pipefail
source "$(dirname "$0")/setup-venv.sh"
inv gpu-clean --inventory hosts/rehearsal.yaml
inv rehearse
inv status --inventory hosts/rehearsal.yaml
