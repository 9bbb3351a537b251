"""`ChioRepositoryEnvironment`: each command through chio's repository execution leg.

Every command is a `chio repository execute` on a workspace made by `chio repository init`: a
fresh cage, the change checked against the workspace's scope and signed. Operation keys are
derived from the run id, the step and the command, so a resumed run replays the steps it already
completed (their retained results, no new launch). When the agent submits, the workspace is
exported (patch, receipts, archives) if `export_dir` is set.

With `socket` set, commands go to the leg's socket instead (`chio session run` binds it into the
worker's cage): no `chio` binary, no root and no state directory on the agent's side. With
`supervisor` set, each command is one request on the supervisor daemon's socket (`chio supervisor
serve`): no `chio` process and no root — the agent's uid needs the daemon's `repository` role
with the workspace granted (or `admin`), and `state_dir` must be absolute.
"""

import hashlib
import json
import os
import shlex
import socket
import subprocess
from typing import Any

from pydantic import BaseModel

from minisweagent.exceptions import Submitted

from chio_minisweagent import common


class ChioRepositoryEnvironmentConfig(BaseModel):
    state_dir: str = ""
    """The workspace's state directory (`chio repository init --state`)."""
    socket: str = ""
    """The leg's Unix socket (a governed session's worker); replaces `state_dir` and `chio`."""
    supervisor: str = ""
    """The supervisor daemon's socket: `chio repository execute` runs there (replaces `chio`)."""
    run_id: str = "run"
    """Names this run in operation keys (the same id resumes the run)."""
    timeout: int = 30
    """Deadline per command, 1 to 300 seconds."""
    chio: str = "chio"
    export_dir: str | None = None
    """Where the bundle goes when the agent submits (must not exist yet)."""
    cwd: str = ""
    """A directory inside the workspace commands start in (relative to /workspace)."""
    env: dict[str, str] = {}
    """Variables prefixed to each command (the leg's cage has no other environment)."""


class ChioRepositoryEnvironment:
    def __init__(self, *, config_class: type = ChioRepositoryEnvironmentConfig, **kwargs):
        self.config = config_class(**kwargs)
        self.step = 0

    def operation_key(self, command: str) -> str:
        digest = hashlib.sha256(command.encode()).hexdigest()[:16]
        return f"{self.config.run_id}:{self.step}:{digest}"

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = max(1, min(300, timeout or self.config.timeout))
        self.step += 1
        full = command
        where = cwd or self.config.cwd
        if where:
            full = f"cd {shlex.quote(where)} && {full}"
        if self.config.env:
            full = " ".join(f"export {k}={shlex.quote(v)};" for k, v in self.config.env.items()) + " " + full
        try:
            result, error = self.request(self.operation_key(command), full, timeout)
        except Exception as e:
            output = common.failed(e)
            common.check_finished(output)
            return output
        if not result:
            output = common.failed(RuntimeError(error))
        elif result.get("deadline_hit"):
            output = common.timed_out(command, timeout, result.get("output", ""))
        else:
            text = result.get("output", "")
            if result.get("transition") == "refused":
                text += f"\n[chio] the change was refused and put back: {result.get('reason')}"
            elif result.get("transition") == "launch_failed":
                text += f"\n[chio] the cage did not run the command: {result.get('reason')}"
            output = {"output": text, "returncode": result.get("exit_status", -1), "exception_info": "",
                      "extra": {"receipt_id": result.get("receipt_id"), "replayed": result.get("replayed", False)}}
            if result.get("transition") == "refused":
                output["returncode"] = 3
        try:
            common.check_finished(output)
        except Submitted:
            if self.config.export_dir:
                self.export(self.config.export_dir)
            raise
        return output

    def request(self, key: str, command: str, timeout: int) -> tuple[dict, str]:
        """One execute: (the result, or {} and why not)."""
        if self.config.socket:
            line = json.dumps({"operation_key": key, "command": command, "deadline_s": timeout}) + "\n"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout + 30)
                s.connect(self.config.socket)
                s.sendall(line.encode())
                answer = json.loads(s.makefile("rb").readline() or b"{}")
            if "error" in answer:
                return {}, f"{answer['error']} (exit {answer.get('exit_code')})"
            return answer, ""
        args = ["execute", "--state", self.config.state_dir, "--operation-key", key, "--deadline", str(timeout),
                "--json", "--", command]
        if self.config.supervisor:
            execute = {"state": self.config.state_dir, "operation_key": key, "deadline": timeout, "json": True,
                       "command": [command]}
            return self.request_supervisor({"execute": execute}, timeout)
        argv = [self.config.chio, "repository", *args]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout + 30,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        result = json.loads(done.stdout or b"{}")
        return result, done.stderr.decode("utf-8", errors="replace").strip() or f"chio exited {done.returncode}"

    def request_supervisor(self, command: dict, timeout: int) -> tuple[dict, str]:
        """A `chio repository` operation (`command`, as the daemon's protocol takes it) as one
        request to the daemon; its stdout and stderr come back through two memfds passed with
        the request."""
        out, err = os.memfd_create("chio-stdout"), os.memfd_create("chio-stderr")
        try:
            payload = {"command": command}
            answer = common.supervisor_request(self.config.supervisor, "repository", payload, [out, err], timeout)
            stderr = common.read_all(err).decode("utf-8", errors="replace").strip()
            if "error" in answer:
                return {}, f"the supervisor refused it: {answer['error']} (exit {answer.get('exit_code')})"
            return json.loads(common.read_all(out) or b"{}"), stderr or f"chio exited {answer.get('exit_status')}"
        finally:
            os.close(out)
            os.close(err)

    def export(self, out_dir: str) -> None:
        subprocess.run([self.config.chio, "repository", "export", "--state", self.config.state_dir, "--out", out_dir],
                       check=True, stdin=subprocess.DEVNULL, capture_output=True)

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return common.template_vars(self.config, **kwargs)

    def serialize(self) -> dict:
        return common.serialize(self)
