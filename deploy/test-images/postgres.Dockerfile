# Stand-in for the public postgres image where no registry is reachable (make test-compose):
# Debian's Postgres on the local base image, initialised from the same POSTGRES_USER,
# POSTGRES_PASSWORD and POSTGRES_DB as the public image, data in the same place.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
    && apt-get update && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -m 0700 -o postgres -g postgres /var/lib/postgresql/data \
    && install -d -m 2775 -o postgres -g postgres /var/run/postgresql
COPY deploy/test-images/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
# As the public image: SIGTERM is Postgres's smart shutdown, which waits for every client to
# disconnect, so a stop that reaches Postgres before its clients ran past the grace period
# (137); SIGINT is the fast shutdown (sessions ended, a checkpoint, exit 0).
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
