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


def supervisor_request(path: str, op: str, args: list[str], fds: list[int], timeout: int) -> dict:
    """One request on the supervisor daemon's socket (`chio supervisor serve`): `op` with `args`,
    `fds` (the command's stdout and stderr) passed with it; returns the daemon's answer."""
    request = {"id": os.urandom(16).hex(), "op": op, "args": args}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout + 30)
        s.connect(path)
        socket.send_fds(s, [json.dumps(request).encode() + b"\n"], fds)
        return json.loads(s.makefile("rb").readline() or b"{}")


def read_all(fd: int) -> bytes:
    """Everything written to the memfd `fd`, from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    with os.fdopen(os.dup(fd), "rb") as f:
        return f.read()
