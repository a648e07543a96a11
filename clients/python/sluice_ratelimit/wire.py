"""The daemon's answer read from bytes as they come (no I/O here): one parser for the blocking
and the asyncio client, so every malformed, oversized or interim (1xx) answer is handled alike."""

from typing import List, Optional, Tuple

from .core import MAX_ANSWER_BYTES, SluiceError

#: Longest status line plus headers accepted (the daemon's are a few hundred bytes).
MAX_HEAD_BYTES = 16 * 1024
#: Longest chunk-size line accepted.
MAX_CHUNK_LINE = 1024


class AnswerParser:
    """Feed it what the connection gives (`feed(b"")` at end of stream) until `done`; then
    `status`, `headers` (lower-case names) and `body`. `reusable` says whether the connection may
    carry another call. Raises `SluiceError` on anything that is not a well-formed HTTP/1.x answer."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = "head"
        self._length: Optional[int] = None
        self._chunked = False
        self._close = False
        self._chunk_left = -1
        self.status = 0
        self.headers: List[Tuple[str, str]] = []
        self.body = bytearray()
        self.done = False
        self.reusable = False

    def feed(self, data: bytes) -> bool:
        """Takes more bytes (b"": the daemon closed its side); True once the answer is whole."""
        if self.done:
            if data:
                self.reusable = False  # bytes nobody asked for: never reuse this connection
            return True
        eof = not data
        self._buf += data
        while not self.done:
            before = (self._state, len(self._buf))
            getattr(self, "_" + self._state)(eof)
            if (self._state, len(self._buf)) == before and not self.done:
                break
        if not self.done and eof:
            raise SluiceError("the daemon closed the connection before a whole answer")
        return self.done

    def _head(self, eof: bool) -> None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise SluiceError("the daemon's answer headers are too large")
            return
        if end > MAX_HEAD_BYTES:
            raise SluiceError("the daemon's answer headers are too large")
        head = bytes(self._buf[:end]).decode("latin-1")
        del self._buf[:end + 4]
        lines = head.split("\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit() \
                or len(parts[1]) != 3:
            raise SluiceError("the daemon's answer is not HTTP/1.1")
        status = int(parts[1])
        if 100 <= status < 200:
            if status == 101:
                raise SluiceError("the daemon switched protocols")
            return  # an interim answer (100 Continue, 103): the final one follows
        self.status = status
        self._close = parts[0] == "HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise SluiceError("a malformed header line in the daemon's answer")
            name, value = name.lower(), value.strip()
            self.headers.append((name, value))
            if name == "content-length":
                if not value.isdigit() or (self._length is not None and self._length != int(value)):
                    raise SluiceError("a bad Content-Length in the daemon's answer")
                self._length = int(value)
            elif name == "transfer-encoding":
                self._chunked = value.lower().endswith("chunked")
                if not self._chunked:
                    raise SluiceError(f"an unknown Transfer-Encoding in the daemon's answer: {value}")
            elif name == "connection":
                tokens = {token.strip().lower() for token in value.split(",")}
                self._close = "close" in tokens or (self._close and "keep-alive" not in tokens)
        if self._length is not None and self._length > MAX_ANSWER_BYTES:
            raise SluiceError("the daemon's answer is too large")
        if status in (204, 304):
            self._finish()
        elif self._chunked:
            self._state = "chunk_size"
        elif self._length is not None:
            self._state = "fixed"
        else:
            self._close = True
            self._state = "until_close"

    def _fixed(self, eof: bool) -> None:
        need = (self._length or 0) - len(self.body)
        self.body += self._buf[:need]
        del self._buf[:need]
        if len(self.body) == (self._length or 0):
            self._finish()

    def _until_close(self, eof: bool) -> None:
        self.body += self._buf
        self._buf.clear()
        if len(self.body) > MAX_ANSWER_BYTES:
            raise SluiceError("the daemon's answer is too large")
        if eof:
            self._finish()

    def _chunk_size(self, eof: bool) -> None:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > MAX_CHUNK_LINE:
                raise SluiceError("a bad chunk in the daemon's answer")
            return
        size_text = bytes(self._buf[:end]).split(b";")[0].strip()
        del self._buf[:end + 2]
        try:
            size = int(size_text, 16)
        except ValueError:
            raise SluiceError("a bad chunk in the daemon's answer") from None
        if size < 0 or len(self.body) + size > MAX_ANSWER_BYTES:
            raise SluiceError("the daemon's answer is too large")
        self._chunk_left = size
        self._state = "trailers" if size == 0 else "chunk_data"

    def _chunk_data(self, eof: bool) -> None:
        if len(self._buf) < self._chunk_left + 2:
            return
        if self._buf[self._chunk_left:self._chunk_left + 2] != b"\r\n":
            raise SluiceError("a bad chunk in the daemon's answer")
        self.body += self._buf[:self._chunk_left]
        del self._buf[:self._chunk_left + 2]
        self._state = "chunk_size"

    def _trailers(self, eof: bool) -> None:
        end = self._buf.find(b"\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise SluiceError("the daemon's answer trailers are too large")
            return
        del self._buf[:end + 2]
        if end == 0:
            self._finish()

    def _finish(self) -> None:
        self.done = True
        self.reusable = not self._close and not self._buf
