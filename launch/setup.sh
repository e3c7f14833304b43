#!/usr/bin/env bash
# One-time machine set-up for gmod (Debian 12): system packages and the LibTorch virtualenv.
# Idempotent and cached: packages already present and an existing venv are reused, so CI pays once.
# Prints the venv path on its last line (used by the build scripts).
#   launch/setup.sh           everything
#   launch/setup.sh --build   what the build needs: the Debian packages and the venv with torch (LibTorch)
#   launch/setup.sh --tests   what only the tests need: transformers and the other pinned PyPI packages the tests
#                             compare with, lmms-eval's venv (tests/run.sh runs this beside the build)
set -euo pipefail
PART="${1:-all}"
case "$PART" in
  all | --build | --tests) ;;
  *) echo "usage: $0 [--build|--tests]" >&2; exit 2 ;;
esac

TORCH_VERSION="${GMOD_TORCH_VERSION:-2.11.0}"
CACHE="${GMOD_CACHE:-$HOME/.cache/gmod}"
PYVER="$(python3 -c 'import sys;print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
VENV="$CACHE/venv-torch-$TORCH_VERSION-py$PYVER"

PKGS=(libopenmpi-dev openmpi-bin libhdf5-dev hdf5-helpers nlohmann-json3-dev libsentencepiece-dev
      libgtest-dev libgmock-dev libpcre2-dev libjpeg-dev libpng-dev ccache gnuplot-nox libcli11-dev
      libcpp-httplib-dev libicu-dev libsimdjson-dev libavformat-dev libavcodec-dev libswscale-dev libavutil-dev
      libisal-dev)

if [ "$PART" != --tests ]; then
  missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "[setup] installing Debian packages: ${missing[*]}" >&2
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  fi

  if [ ! -f "$VENV/.complete" ]; then
    echo "[setup] creating $VENV with torch==$TORCH_VERSION (first time only; a few GB)" >&2
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip >&2
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy safetensors >&2
    touch "$VENV/.complete"
  fi
fi
if [ "$PART" = --tests ] && [ ! -f "$VENV/.complete" ]; then
  echo "[setup] $VENV is not set up: run launch/setup.sh --build first" >&2
  exit 1
fi
if [ "$PART" != --build ]; then
  # transformers for the tests that compare with it (ctest export_transformers, the Python benchmarks): the version
  # tests/fixtures/hf/*/config.json were made with. Its own marker, so an existing cached venv gets it without being
  # rebuilt; a new pin gets a new marker.
  TRANSFORMERS_VERSION="${GMOD_TRANSFORMERS_VERSION:-5.24.0}"
  if [ ! -f "$VENV/.transformers-$TRANSFORMERS_VERSION" ]; then
    echo "[setup] installing transformers==$TRANSFORMERS_VERSION into $VENV (for tests)" >&2
    "$VENV/bin/pip" install -q "transformers==$TRANSFORMERS_VERSION" >&2
    touch "$VENV/.transformers-$TRANSFORMERS_VERSION"
  fi
  # Its serving extra for `transformers serve` on gmod's exports (tests/launch/check_hf_export.py): fastapi, uvicorn.
  if [ ! -f "$VENV/.transformers-serving-$TRANSFORMERS_VERSION" ]; then
    echo "[setup] installing transformers[serving]==$TRANSFORMERS_VERSION into $VENV (for tests)" >&2
    "$VENV/bin/pip" install -q "transformers[serving]==$TRANSFORMERS_VERSION" >&2
    touch "$VENV/.transformers-serving-$TRANSFORMERS_VERSION"
  fi
  # The official openai client for the `gmod serve` tests (tests/serve/): pinned, its own marker as above.
  OPENAI_VERSION="${GMOD_OPENAI_VERSION:-3.51.0}"
  if [ ! -f "$VENV/.openai-$OPENAI_VERSION" ]; then
    echo "[setup] installing openai==$OPENAI_VERSION into $VENV (for tests)" >&2
    "$VENV/bin/pip" install -q "openai==$OPENAI_VERSION" >&2
    touch "$VENV/.openai-$OPENAI_VERSION"
  fi
  # lmms-eval (PyPI, pinned) for tests/serve/serve_lmms_eval_test.py, in its own venv. Installed plainly, its
  # declared dependencies pull a second CUDA torch with its nvidia wheels (a 6.9 GB venv, 15 min here), so this
  # venv reads the torch venv's packages through a .pth file (torch, numpy, transformers, openai, accelerate, ...)
  # and installs only the rest (~1 GB), with torchvision pinned to the build matching this torch so that pip keeps
  # it. Keyed by both versions; the test finds its python through $VENV/lmms-eval-python.
  LMMS_EVAL_VERSION="${GMOD_LMMS_EVAL_VERSION:-0.7.3}"
  TORCHVISION_VERSION="${GMOD_TORCHVISION_VERSION:-0.26.0}"
  LMMS_VENV="$CACHE/venv-lmms-eval-$LMMS_EVAL_VERSION-torch-$TORCH_VERSION-py$PYVER"
  if [ ! -f "$LMMS_VENV/.complete" ]; then
    echo "[setup] creating $LMMS_VENV with lmms-eval==$LMMS_EVAL_VERSION (for tests; first time only)" >&2
    rm -rf "$LMMS_VENV"
    python3 -m venv "$LMMS_VENV"
    purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
    "$VENV/bin/python" -c "$purelib" > "$("$LMMS_VENV/bin/python" -c "$purelib")/gmod-torch-venv.pth"
    # filelock < 4: lmms-eval 0.7.3 imports filelock._api, which filelock 4 no longer has.
    "$LMMS_VENV/bin/pip" install -q "lmms-eval==$LMMS_EVAL_VERSION" "torch==$TORCH_VERSION" \
      "torchvision==$TORCHVISION_VERSION" "filelock==3.32.7" >&2
    touch "$LMMS_VENV/.complete"
  fi
  echo "$LMMS_VENV/bin/python" > "$VENV/lmms-eval-python"
  # PEFT for the LoRA parity test (tests/model/check_lora_peft.py, ctest lora_peft): pinned to a release that supports
  # the transformers above; its own marker as above.
  PEFT_VERSION="${GMOD_PEFT_VERSION:-0.21.2}"
  if [ ! -f "$VENV/.peft-$PEFT_VERSION" ]; then
    echo "[setup] installing peft==$PEFT_VERSION into $VENV (for tests)" >&2
    "$VENV/bin/pip" install -q "peft==$PEFT_VERSION" >&2
    touch "$VENV/.peft-$PEFT_VERSION"
  fi
  # TensorBoard's own event reader checks gmod's event files (metrics.tensorboard; tests/trainer/check_tensorboard.py).
  TENSORBOARD_VERSION="${GMOD_TENSORBOARD_VERSION:-2.21.0}"
  if [ ! -f "$VENV/.tensorboard-$TENSORBOARD_VERSION" ]; then
    echo "[setup] installing tensorboard==$TENSORBOARD_VERSION into $VENV (for tests)" >&2
    "$VENV/bin/pip" install -q "tensorboard==$TENSORBOARD_VERSION" >&2
    touch "$VENV/.tensorboard-$TENSORBOARD_VERSION"
  fi
  # sentencepiece: transformers reads a SentencePiece tokenizer.model (LLaMA-2/Vicuna, as LLaVA publishes it) only
  # through it; the export tests load gmod's Hugging Face exports with AutoProcessor (tests/launch/check_hf_export.py).
  SENTENCEPIECE_VERSION="${GMOD_SENTENCEPIECE_VERSION:-0.2.1}"
  if [ ! -f "$VENV/.sentencepiece-$SENTENCEPIECE_VERSION" ]; then
    echo "[setup] installing sentencepiece==$SENTENCEPIECE_VERSION into $VENV (for tests)" >&2
    "$VENV/bin/pip" install -q "sentencepiece==$SENTENCEPIECE_VERSION" >&2
    touch "$VENV/.sentencepiece-$SENTENCEPIECE_VERSION"
  fi
fi
echo "$VENV"
