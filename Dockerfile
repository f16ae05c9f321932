# syntax=docker/dockerfile:1
#
# The toolfleet image: one binary, the expense pack and nothing else.
#
#   docker build -t toolfleet .
#   docker run --rm -p 8080:8080 -v "$PWD/toolfleet.toml:/etc/toolfleet/toolfleet.toml:ro" \
#     -e TOOLFLEET_CONFIG=/etc/toolfleet/toolfleet.toml toolfleet   # serve: SQLite and the in-process queue
#   docker run --rm toolfleet dispatcher --help           # or worker, migrate, call, tools, bench
#
# serve listens on 0.0.0.0 here, so it needs a token of [[auth.tokens]] in its
# configuration (it makes a development token on a loopback address only):
# the toolfleet.toml above names one, and includes the expense pack
# (/usr/share/toolfleet/expenses/toolfleet.toml) or tools of its own.
#
# docker-compose.yml runs it distributed (migrate, dispatchers, workers).

# The newest rust-version of the workspace's crates (toolfleet-broker: lapin 4 needs 1.88).
ARG RUST_VERSION=1.88

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# The registry and the target directory live in cache mounts, so the binary is
# copied out of the target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p toolfleet \
    && cp target/release/toolfleet /usr/local/bin/toolfleet

FROM debian:bookworm-slim AS runtime
# ca-certificates: http executors and webhooks verify TLS against the system store.
# tini: the init in front of toolfleet (see ENTRYPOINT).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 toolfleet \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/toolfleet --no-create-home toolfleet \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/toolfleet
COPY --from=build /usr/local/bin/toolfleet /usr/local/bin/toolfleet
# The expense pack, for configurations to include (deploy/compose/toolfleet.toml does).
COPY examples/expenses/toolfleet.toml /usr/share/toolfleet/expenses/toolfleet.toml
USER 10001:10001
# The data directory (.toolfleet: SQLite, secrets; owner-only) lands here.
WORKDIR /var/lib/toolfleet
# Listen beyond the container's loopback; a configuration file's `listen` is
# overridden too. No development token is made on this address: configure
# [[auth.tokens]].
ENV TOOLFLEET_LISTEN=0.0.0.0:8080
EXPOSE 8080
# Workers serve /metrics, /healthz and /readyz on `metrics_listen` (9091).
EXPOSE 9091
# No HEALTHCHECK: the image has no HTTP client; docker-compose.yml probes
# the dispatchers' /readyz itself, and Kubernetes probes every process.
# tini is PID 1: it reaps the processes that exec tools orphan (toolfleet
# reaps only its own children) and forwards signals to toolfleet, so SIGTERM
# drains it as anywhere else. No -g: toolfleet alone handles the signal; its
# tools run in process groups of their own and die with their calls.
ENTRYPOINT ["/usr/bin/tini", "--", "toolfleet"]
CMD ["serve"]
