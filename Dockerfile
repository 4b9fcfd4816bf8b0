# The duejobs image used by docker-compose.yml: the package and its CLI, nothing else.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY duejobs ./duejobs
COPY migrations ./migrations
RUN pip install --no-cache-dir ".[binary]" && useradd --system duejobs
USER duejobs
ENTRYPOINT ["duejobs"]
