# The gradwatch server (no torch; with the PostgreSQL driver for `--profile postgres`): see docker-compose.yml.
FROM python:3.11-slim
WORKDIR /src
COPY backend ./backend
COPY frontend ./frontend
RUN pip install --no-cache-dir "./backend[postgres]" && rm -rf /src
WORKDIR /data
EXPOSE 8765
CMD ["gradwatch", "serve", "--host", "0.0.0.0", "--port", "8765", "--db", "sqlite:////data/gradwatch.db"]
