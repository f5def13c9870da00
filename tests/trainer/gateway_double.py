"""The contract's test double of the rollout gateway's INTERNAL port (trainer rank 0 <-> gateway), to be
replaced by the real gateway (``python -m grpo_gateway``) in the end-to-end test. It implements exactly
the internal routes of the contract and nothing of the client port:

* POST /internal/v1/groups {step, count, attempt, wait_seconds}: groups received (``submit``) are
  assigned to steps in arrival order, ``count`` per step, and an assignment is fixed once made (asking
  again for the same step returns the same groups: replay); long-polls up to wait_seconds, then answers
  no groups; a stop (``stop("terminate" | "cancel")``) is answered instead of groups.
* POST /internal/v1/progress {attempt, step, checkpoint, state}: recorded; assignments of steps at or
  before the newest reported checkpoint are dropped (they can never be replayed).

Unlike the real gateway it does not check what it is given: tests hand it malformed groups on purpose to
show that the trainer refuses them.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class GatewayDouble:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pending: list[dict[str, Any]] = []
        self.assigned: dict[int, list[dict[str, Any]]] = {}
        self.requests: list[dict[str, Any]] = []
        self.served: list[tuple[int, int, list[int]]] = []  # (attempt, step, batch ids)
        self.progress: list[dict[str, Any]] = []
        self.stop_kind: str | None = None
        self.checkpoint_request: dict[str, Any] | None = None
        self.next_batch_id = 0
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                if self.path == "/internal/v1/groups":
                    answer = double._groups(body)
                elif self.path == "/internal/v1/progress":
                    answer = double._progress(body)
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> GatewayDouble:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- what the client side would do -------------------------------------------------------------------

    def submit(self, items: list[dict[str, Any]]) -> int:
        with self.cond:
            batch_id = self.next_batch_id
            self.next_batch_id += 1
            self.pending.append({"batch_id": batch_id, "items": items})
            self.cond.notify_all()
            return batch_id

    def stop(self, kind: str) -> None:
        with self.cond:
            self.stop_kind = kind
            self.cond.notify_all()

    def request_checkpoint(self, name: str) -> None:
        with self.cond:
            self.checkpoint_request = {"name": name, "metadata": {}}

    def trained_step(self) -> int:
        with self.cond:
            return max((p["step"] for p in self.progress), default=0)

    def wait_trained(self, step: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.trained_step() < step:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the trainer did not report step {step}; progress: {self.progress[-3:]}"
                )
            time.sleep(0.05)

    # -- the internal routes ---------------------------------------------------------------------------------

    def _groups(self, body: dict[str, Any]) -> dict[str, Any]:
        step, count = int(body["step"]), int(body["count"])
        deadline = time.monotonic() + float(body.get("wait_seconds", 30))
        with self.cond:
            self.requests.append(body)
            while True:
                if self.stop_kind is not None:
                    return {"step": step, "groups": [], "stop": self.stop_kind}
                if step not in self.assigned and len(self.pending) >= count:
                    self.assigned[step], self.pending = self.pending[:count], self.pending[count:]
                if step in self.assigned:
                    groups = self.assigned[step]
                    self.served.append((int(body.get("attempt", 0)), step, [g["batch_id"] for g in groups]))
                    answer: dict[str, Any] = {"step": step, "groups": groups}
                    if self.checkpoint_request is not None:
                        answer["checkpoint"], self.checkpoint_request = self.checkpoint_request, None
                    return answer
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"step": step, "groups": []}
                self.cond.wait(left)

    def _progress(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.cond:
            self.progress.append(body)
            checkpoint = body.get("checkpoint")
            if checkpoint:
                for step in [s for s in self.assigned if s <= checkpoint["step"]]:
                    del self.assigned[step]
            self.cond.notify_all()
        return {"ok": True}
