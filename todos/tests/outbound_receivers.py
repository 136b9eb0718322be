"""Real receivers on loopback for the outbound tests: an HTTP server that records each request (and can
answer with a status or a redirect), and an SMTP server (aiosmtpd) that keeps each message."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    server: ThreadingHTTPServer
    requests: list[Received] = field(default_factory=list)
    status: int = 204
    location: str | None = None  # answer every request with a 302 to here

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            receiver.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if receiver.location is not None:
                self.send_response(302)
                self.send_header("location", receiver.location)
            else:
                self.send_response(receiver.status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextlib.contextmanager
def running_receiver() -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    recv = Receiver(server)
    server.RequestHandlerClass = _handler(recv)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recv
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as recv:
        yield recv


@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[Message] = field(default_factory=list)


@pytest.fixture
def smtp() -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    with socket.socket() as probe:  # a free port (aiosmtpd's readiness check connects to the port it is given)
        probe.bind(("127.0.0.1", 0))
        box = Mailbox("127.0.0.1", probe.getsockname()[1])

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            box.messages.append(message_from_bytes(envelope.original_content))
            return "250 OK"

    controller = Controller(Handler(), hostname=box.host, port=box.port)
    controller.start()
    yield box
    controller.stop()
