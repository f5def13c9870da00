"""python3 -c <this> --termination-log PATH [--keep-log FILE] -- vllm serve ARGS: vLLM, its failures explained.

vLLM exits 0 when its engine dies, logging the cause kilobytes before its end: the kubelet would report
nothing. A server stops only when told to, so any other exit writes the log's exception lines and tail
to PATH (the termination message) and exits non-zero. Stdlib only, Python 3.9+ (the vLLM image's).

--keep-log FILE also appends the output to FILE, which outlives the pod (a gang restart deletes every pod).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from typing import BinaryIO

# A traceback's last line, maybe behind vLLM's "(EngineCore pid=12)" or log prefix; not a line that only
# mentions one (at every start vLLM warns of "errors like `OSError: ...`").
EXCEPTION = re.compile(r"(?:^|[)\]] )([A-Za-z_][\w.]*(?:Error|Exception|Interrupt): \S.*)")


class Kept:
    """--keep-log FILE: a bounded copy (FILE, then FILE.1) on the job's volume; given up on an OSError."""

    def __init__(self, path: str | None, limit: int = 16 << 20) -> None:
        self.path, self.limit, self.lock, self.size = path, limit, threading.Lock(), 0
        self.file: BinaryIO | None = None
        self.write(b"")

    def write(self, line: bytes) -> None:
        with self.lock:
            try:
                if self.path and (self.file is None or self.size + len(line) > self.limit):
                    if self.file:
                        self.file.close()
                        os.replace(self.path, self.path + ".1")
                    os.makedirs(os.path.dirname(self.path), exist_ok=True)
                    file = self.file = open(self.path, "ab")  # noqa: SIM115
                    self.size = file.tell()
                if self.file:
                    self.size += self.file.write(line[: self.limit])
                    self.file.flush()
            except OSError as e:
                print(f"not keeping vLLM's log in {self.path}: {e}", file=sys.stderr)
                self.path = self.file = None


def pump(pipe: BinaryIO, out: BinaryIO, tail: deque[str], kept: Kept) -> None:
    for line in iter(pipe.readline, b""):
        out.write(line)
        out.flush()
        kept.write(line)
        tail.append(line.decode(errors="replace").rstrip()[:1000])


def message(tail: list[str], status: str) -> bytes:
    """The first distinct exception lines (the cause), then as much of the tail as fits, then status."""
    causes: dict[str, str] = {}  # by the exception's text: each process logs it again
    for line in tail:
        match = EXCEPTION.search(line)
        if match and len(causes) < 3:
            causes.setdefault(match.group(1), line[:500])
    head = "".join(line + "\n" for line in causes.values()).encode() + b"--- the end of vLLM's log ---\n"
    room = 4096 - len(head) - len(status.encode()) - 1  # the kubelet keeps 4096 bytes
    body = "\n".join(tail).encode()[-room:] if room > 0 else b""
    return (head + body + b"\n" + status.encode())[:4096]


def main(argv: list[str]) -> int:
    options = argv[: argv.index("--")] if "--" in argv else argv
    path = options[options.index("--termination-log") + 1]
    kept = Kept(options[options.index("--keep-log") + 1] if "--keep-log" in options else None)
    tail: deque[str] = deque(maxlen=1000)  # vLLM logs 100+ lines after the cause: a traceback per request
    command = argv[argv.index("--") + 1 :] if "--" in argv else []
    try:
        if not command:
            raise OSError("no command after --")
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        status, code = f"cannot run vLLM: {e} (the image needs python3 and vllm on PATH)", 127
    else:
        stop: list[int] = []

        def forward(signum: int, frame: object) -> None:
            stop.append(signum)
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        # Both streams: vLLM logs to stdout, Python prints uncaught tracebacks to stderr.
        pipes = ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer))
        readers = [threading.Thread(target=pump, args=(*p, tail, kept), daemon=True) for p in pipes]
        for reader in readers:
            reader.start()
        returncode = child.wait()
        for reader in readers:
            reader.join(10)  # vLLM's engine processes may hold the pipes open a while: not longer
        code = returncode if returncode >= 0 else 128 - returncode
        if stop:
            return code
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        status, code = f"vLLM {how} without being asked to stop", code or 1
    print(status, file=sys.stderr)
    try:
        with open(path, "wb") as out:
            out.write(message(list(tail), status) if tail else status.encode())
    except OSError as e:
        print(f"cannot write {path}: {e}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
