"""A local stand-in for the Hugging Face Hub: the routes huggingface_hub 2.x
uses to list a repo's files and download them (HF_ENDPOINT points at it),
serving files from memory on 127.0.0.1."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _gitsha(b: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


class Hub:
    """repos: {"org/name": {"path/in/repo": bytes}}. Use as a context manager;
    .endpoint is the URL for HF_ENDPOINT; .log the requests seen, .tokens
    the bearer token each sent."""

    def __init__(self, repos: dict[str, dict[str, bytes]]):
        self.repos = repos
        self.log: list[str] = []
        self.tokens: list[str | None] = []     # each request's bearer token (None: none sent)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):   # quiet
                pass

            def _send(self, code, body=b"", headers=None, head=False):
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _handle(self, head: bool):
                u = urlparse(self.path)
                p, q = unquote(u.path), parse_qs(u.query)
                hub.log.append(f"{self.command} {p}")
                auth = self.headers.get("Authorization") or ""
                hub.tokens.append(auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None)
                for repo, files in hub.repos.items():
                    api = f"/api/models/{repo}"
                    if p.startswith(f"{api}/tree/"):
                        rec = q.get("recursive", ["false"])[0].lower() == "true"
                        out = [dict(type="file", path=f, size=len(b), oid=_gitsha(b),
                                    lfs={"oid": _sha256(b), "size": len(b), "pointerSize": 134})
                               for f, b in files.items() if rec or "/" not in f]
                        out += [{"type": "directory", "path": d, "oid": "f" * 40}
                                for d in sorted({f.split("/")[0] for f in files if "/" in f})]
                        return self._send(200, json.dumps(out).encode(), {"Content-Type": "application/json"}, head)
                    pre = f"/{repo}/resolve/"
                    if p.startswith(pre):
                        _, _, fn = p[len(pre):].partition("/")
                        if fn not in files:
                            return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT},
                                              head)
                        b = files[fn]
                        hdr = {"ETag": f'"{_sha256(b)}"', "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes"}
                        rng = self.headers.get("Range")
                        if rng and not head:
                            start = int(rng.split("=")[1].split("-")[0])
                            hdr["Content-Range"] = f"bytes {start}-{len(b) - 1}/{len(b)}"
                            return self._send(206, b[start:], hdr)
                        return self._send(200, b, hdr, head)
                return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head)

            def do_GET(self):
                self._handle(False)

            def do_HEAD(self):
                self._handle(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Hub":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
