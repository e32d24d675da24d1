# The gradwatch server (no torch; with the PostgreSQL driver for `--profile postgres`): see docker-compose.yml.

# Plotly's basic bundle, from the npm registry as vendor/package-lock.json pins it, built by the
# same script as `make setup`: the dashboard starts in a fifth of the time the plotly package's
# full bundle (the server's fallback) takes.
FROM node:22-bookworm-slim AS plotly
WORKDIR /src
COPY vendor/package.json vendor/package-lock.json ./vendor/
COPY scripts/install-vendor-js.sh ./scripts/
RUN ./scripts/install-vendor-js.sh

FROM python:3.11-slim
WORKDIR /src
COPY backend ./backend
COPY frontend ./frontend
# Before the install: the wheel carries frontend/, vendor bundle included.
COPY --from=plotly /src/frontend/vendor/plotly.min.js ./frontend/vendor/plotly.min.js
RUN pip install --no-cache-dir "./backend[postgres]" && rm -rf /src
WORKDIR /data
EXPOSE 8765
CMD ["gradwatch", "serve", "--host", "0.0.0.0", "--port", "8765", "--db", "sqlite:////data/gradwatch.db"]
