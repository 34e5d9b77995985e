"""A standard-library HTTP server on loopback, for the tests of servers that ignore Range."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer


def serving(server: ThreadingHTTPServer) -> Iterator[str]:
    """Serve ``server`` in a daemon thread; yield its base URL; shut it down after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
