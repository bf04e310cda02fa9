# The worker's image (docker-compose.yml): the wheel is built with the C extension in a
# stage that has a compiler, and installed in a slim image that has none
# (docs/decisions/worker-image.md).
FROM python:3.11 AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY sluicegate ./sluicegate
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
COPY --from=wheel /wheels /wheels
# The import fails the build if the wheel lost its extension (it is optional in a build).
RUN pip install --no-cache-dir /wheels/*.whl && \
    python -c "import sluicegate.schemas._speedups"
# `examples` is not part of the package: the demo app is imported from /app.
WORKDIR /app
COPY examples ./examples
ENV PYTHONPATH=/app
CMD ["sh", "-c", "sluicegate topics create --app examples.demo && exec sluicegate worker --app examples.demo"]
