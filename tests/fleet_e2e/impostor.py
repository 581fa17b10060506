"""An impostor coordinator for tests/fleet_e2e: a TLS server with a certificate of another CA,
run in a namespace of its own on the coordinator's address. It answers nothing; it records, one
JSON line per connection, whether the TLS handshake completed and every byte the client sent
after it (what an agent would have leaked: a request line, a token).

    python impostor.py CERT KEY HOST PORT LOG"""

from __future__ import annotations

import json
import socket
import ssl
import sys


def main(argv: list[str]) -> int:
    cert, key, host, port, log = argv
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server((host, int(port)))
    with open(log, "a", buffering=1) as out:
        out.write(json.dumps({"listening": f"{host}:{port}"}) + "\n")
        while True:
            conn, peer = listener.accept()
            conn.settimeout(5)
            entry: dict[str, str] = {"peer": peer[0]}
            try:
                secured = context.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError) as error:
                entry.update(handshake="failed", error=str(error))
                conn.close()
            else:
                received = b""
                try:
                    while chunk := secured.recv(65536):
                        received += chunk
                        if len(received) > 65536:
                            break
                except (ssl.SSLError, OSError):
                    pass
                entry.update(handshake="ok", received=received.decode("latin-1"))
                secured.close()
            out.write(json.dumps(entry) + "\n")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
