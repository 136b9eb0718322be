"""A minimal HTTP/1.1 client on asyncio streams: thousands of concurrent keep-alive requests from one
thread, for the long-poll tests and bench/http/longpoll_capacity.py (requests would need a thread each)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class Connection:
    """One keep-alive connection to ``base`` (http://host:port), sending JSON with a bearer token."""

    def __init__(self, base: str, token: str | None = None) -> None:
        url = urlsplit(base)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 80
        self.token = token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def send(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> None:
        """Write one request without reading its answer (a long-poll in flight)."""
        if self.writer is None:
            await self.open()
        assert self.writer is not None
        data = b"" if body is None else json.dumps(body).encode()
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(data)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        if self.token:
            head.append(f"Authorization: Bearer {self.token}")
        head.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, Any]:
        """Read one response: its status and its JSON body (None if it has none; text if not JSON)."""
        assert self.reader is not None
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        length = 0
        is_json = True
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            elif name.strip().lower() == "content-type":
                is_json = "json" in value
        raw = await self.reader.readexactly(length) if length else b""
        if not raw:
            return status, None
        return status, (json.loads(raw) if is_json else raw.decode(errors="replace"))

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        await self.send(method, path, body, headers)
        return await self.answer()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
