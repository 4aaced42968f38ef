"""An httpx transport over aiohttp: the httpx API, aiohttp's HTTP/1.1 stack underneath.

Why: httpx's own stack (httpcore + h11) handles every chunk of a chunked SSE
response as its own event through several layers, about 3x the CPU of
aiohttp per streamed token (docs/benchmarks.md, "Replay client"). A time-scaled
simulator or a fast GPU streams tens of thousands of tokens a second; the
client must not be what limits the measurement. aiohttp's ``iter_any``
hands over everything already received in one piece, so under load one read
carries many SSE events.

aiohttp's errors are translated to httpx's here, where they enter, so the
client sees one exception tree whatever the transport.

Timeouts: each request's httpx timeout (``request.extensions["timeout"]``, set by
the client from its ``timeout=`` or a call's own) becomes aiohttp's: ``connect``
bounds the TCP connect, ``read`` every wait for bytes (the response head, then
each read of the body). ``None`` waits for ever, as in httpx.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import httpx

_SKIPPED_HEADERS = frozenset({"host", "content-length", "transfer-encoding"})
READ_CHUNK_BYTES = 2**16


class _AiohttpStream(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._response.content.iter_any():
                yield data
        except TimeoutError as exc:  # aiohttp's SocketTimeoutError: no byte within `read`
            raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
        except aiohttp.ClientPayloadError as exc:
            raise httpx.RemoteProtocolError(str(exc) or "cut response body") from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(str(exc) or type(exc).__name__) from exc

    async def aclose(self) -> None:
        self._response.release()


def _client_timeout(request: httpx.Request) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for this request from httpx's (``None``: no limit)."""
    timeout = request.extensions.get("timeout", {})
    return aiohttp.ClientTimeout(
        total=None, sock_connect=timeout.get("connect"), sock_read=timeout.get("read")
    )


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx transport on one aiohttp session (created in the running loop on first use)."""

    def __init__(self, *, max_connections: int | None = None) -> None:
        self._limit = max_connections or 0  # aiohttp: 0 = no limit
        self._session: aiohttp.ClientSession | None = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit),
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=False,  # the bytes as sent, as httpx's aiter_raw expects
                skip_auto_headers=("User-Agent", "Content-Type"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._ensure_session()
        headers = [
            (name, value)
            for name, value in request.headers.multi_items()
            if name.lower() not in _SKIPPED_HEADERS
        ]
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=body or None,
                allow_redirects=False,
                read_bufsize=READ_CHUNK_BYTES,
                timeout=_client_timeout(request),
            )
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except TimeoutError as exc:  # SocketTimeoutError: no response head within `read`
            raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.TransportError(str(exc), request=request) from exc
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_AiohttpStream(response),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
