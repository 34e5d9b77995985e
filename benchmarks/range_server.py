"""A local HTTP server with real ``Range`` support that counts the requests it answers and
the bytes it sends: the remote benchmark (``remote_batch.py``) and the remote tests
(``tests/io/test_remote.py``) both measure torchless's remote reads with it."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["RangeServer", "serve"]


class RangeServer(ThreadingHTTPServer):
    """Serves the files under ``root``; with ``ranges=False`` it ignores ``Range`` and sends
    whole files (the server torchless must refuse)."""

    daemon_threads = True

    def __init__(self, root: Path, ranges: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.ranges = ranges
        self.requests = 0
        self.sent = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _Handler(BaseHTTPRequestHandler):
    server: RangeServer

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = self.server.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        size = path.stat().st_size
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        with self.server.lock:
            self.server.requests += 1
        if m is None or not self.server.ranges:
            body = path.read_bytes()
            self.send_response(200)
        else:
            start, end = int(m.group(1)), min(int(m.group(2)), size - 1)
            if start >= size:
                self.send_error(416)
                return
            with path.open("rb") as f:
                f.seek(start)
                body = f.read(end + 1 - start)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        # the validators real servers send (what a conversion certificate records)
        stat = path.stat()
        self.send_header("ETag", f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"')
        self.send_header("Last-Modified", formatdate(stat.st_mtime, usegmt=True))
        self.end_headers()
        # counted before it is written: the client may have read it (and the test looked at
        # the count) before write() returns here
        with self.server.lock:
            self.server.sent += len(body)
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


def serve(root: Path, ranges: bool = True) -> Iterator[RangeServer]:
    """Run a server over ``root`` in a thread for as long as the generator is open."""
    server = RangeServer(root, ranges)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
