# The sluice image: docker build -t sluice:0.1.0 .
# Multi-stage: the release binary is built in the Rust image, then copied, stripped (the
# release profile's line tables serve profiling, not a container), into Debian slim.
# Run: docker run -p 9092:9092 -p 9644:9644 -v sluice-data:/var/lib/sluice \
#        -e SLUICE_ADVERTISED_LISTENER=<host clients reach>:9092 sluice:0.1.0
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p sluice-cli \
    && strip --strip-all -o /sluice target/release/sluice

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 sluice \
    && useradd --system --uid 10001 --gid sluice --home-dir /var/lib/sluice --no-create-home sluice \
    && install -d -o sluice -g sluice -m 0750 /var/lib/sluice /etc/sluice
COPY --from=builder /sluice /usr/bin/sluice
COPY sluice.example.toml /usr/share/doc/sluice/sluice.example.toml
COPY LICENSE /usr/share/doc/sluice/copyright
USER sluice:sluice
WORKDIR /var/lib/sluice
VOLUME ["/var/lib/sluice"]
# Kafka clients, the controller quorum (cluster mode), metrics with /healthz and /readyz.
EXPOSE 9092 9093 9644
ENV SLUICE_LISTEN=0.0.0.0:9092 \
    SLUICE_DATA_DIR=/var/lib/sluice \
    SLUICE_METRICS_LISTEN=0.0.0.0:9644
# SIGTERM is a clean shutdown (every log fsynced and sealed): give `docker stop -t` time.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=3s CMD ["/usr/bin/sluice", "cluster", "health", "-b", "127.0.0.1:9092"]
ENTRYPOINT ["/usr/bin/sluice"]
CMD ["serve"]
