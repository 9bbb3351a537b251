"""What both environments share: mini-swe-agent's result contract and completion check."""

import json
import os
import platform
import socket
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def check_finished(output: dict) -> None:
    """Raise Submitted as mini-swe-agent's own environments do: first output line SUBMIT, status 0."""
    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
        submission = "".join(lines[1:])
        raise Submitted(
            {
                "role": "exit",
                "content": submission,
                "extra": {"exit_status": "Submitted", "submission": submission},
            }
        )


def timed_out(command: str, timeout: int, output: str) -> dict[str, Any]:
    """The result mini-swe-agent's local environment gives for a command that hit its timeout."""
    message = f"Command '{command}' timed out after {timeout} seconds"
    return {
        "output": output,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {message}",
        "extra": {"exception_type": "TimeoutExpired", "exception": message},
    }


def failed(error: Exception, output: str = "") -> dict[str, Any]:
    return {
        "output": output,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {error}",
        "extra": {"exception_type": type(error).__name__, "exception": str(error)},
    }


def template_vars(config, **kwargs) -> dict[str, Any]:
    # Unlike the local environment, the agent process's own environment is not offered to the
    # templates: nothing of it reaches the cage, and a prompt should not suggest otherwise.
    return recursive_merge(config.model_dump(), platform.uname()._asdict(), kwargs)


def serialize(env) -> dict:
    return {
        "info": {
            "config": {
                "environment": env.config.model_dump(mode="json"),
                "environment_type": f"{env.__class__.__module__}.{env.__class__.__name__}",
            }
        }
    }


# One open connection per daemon socket, reused for the next request (the daemon serves the
# requests of a connection one after another): an agent's commands skip connecting and the
# daemon's credential check each time.
_connections: dict[str, socket.socket] = {}


PROTOCOL = "chio.supervisor.v2"


def size_bytes(text: str) -> int | None:
    """A size as chio's flags take it ("512M", "64K", "2G", "4096"), or None for "none"."""
    t = text.strip()
    if t.lower() == "none":
        return None
    for suffix in ("iB", "ib", "B", "b"):
        if t.endswith(suffix):
            t = t[: -len(suffix)]
            break
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    mult = units.get(t[-1:].lower(), 1)
    return int(t[:-1] if mult != 1 else t) * mult


def cpu_millis(text: str) -> int | None:
    """CPUs as chio's --cpus takes them ("1", "0.5"), in thousandths, or None for "none"."""
    if text.strip().lower() == "none":
        return None
    return round(float(text) * 1000)


def supervisor_request(path: str, op: str, payload: dict, fds: list[int], timeout: int) -> dict:
    """One request on the supervisor daemon's socket (`chio supervisor serve`, protocol
    chio.supervisor.v2): `op` with `payload` (a launch's `launch`, a repository operation's
    `command`), `fds` (the command's stdout and stderr) passed with it; returns the daemon's answer.

    A kept connection the daemon has closed meanwhile (its idle timeout, a restart) is replaced
    and the request sent again: under the same id, which the daemon runs at most once (a repeat
    gets the first one's answer)."""
    rid = os.urandom(16).hex()
    line = json.dumps({"protocol": PROTOCOL, "id": rid, "op": op, **payload}).encode() + b"\n"
    while True:
        kept = _connections.pop(path, None)
        s = kept or socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not kept:
                s.connect(path)
            s.settimeout(timeout + 30)
            socket.send_fds(s, [line], fds)
            answer = json.loads(_read_line(s) or b"{}")
        except (OSError, ValueError):
            s.close()
            if kept:
                continue
            raise
        if answer.get("id") != rid:
            # Not our answer: the daemon's farewell on a connection it closed while it was kept.
            s.close()
            if kept:
                continue
            return answer
        _connections[path] = s
        return answer


def _read_line(s: socket.socket) -> bytes:
    """One answer line (the daemon writes one per request)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def read_all(fd: int) -> bytes:
    """Everything written to the memfd `fd`, from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(os.dup(fd), "rb") as f:
        return f.read()
