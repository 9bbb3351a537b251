"""`ChioEnvironment`: each command in a fresh chio cage (`chio cage run`, or a request to the
supervisor daemon's socket when `supervisor` is set: no chio process per command).

The agent's working directory is bound read-write at /workspace (edits land in place, like the
local environment); the root is an imported image or the host's system directories, read-only;
no network; memory, pids, CPU and time bounded; the environment is only the configured
variables (the agent's own environment — its API keys — never reaches the command). A timeout
kills everything the command started: the cage's pid namespace and cgroup go with it.
"""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from chio_minisweagent import common


class ChioEnvironmentConfig(BaseModel):
    cwd: str = ""
    """Host directory bound at /workspace (default: the agent's working directory)."""
    env: dict[str, str] = {}
    """The command's environment besides PATH, HOME=/workspace and TMPDIR=/tmp."""
    timeout: int = 30
    """Seconds per command."""
    chio: str = "chio"
    """The chio binary."""
    image: str | None = None
    """An imported image (reference or ID); default: the host's system directories, read-only."""
    state_dir: str | None = None
    """The image store (default $CHIO_STATE_DIR or /var/lib/chio)."""
    memory: str = "512M"
    pids: int = 64
    cpus: str = "1"
    network: str = "none"
    """`none` or `loopback` (a network namespace of the cage's own either way)."""
    uid: int | None = None
    """uid in the cage (default: the owner of the workspace, so edits land as the agent's)."""
    gid: int | None = None
    supervisor: str | None = None
    """The supervisor daemon's socket (`chio supervisor serve`; this process's uid needs the admin
    role there, for the workspace): each command is one request on it instead of a chio process."""


class ChioEnvironment:
    def __init__(self, *, config_class: type = ChioEnvironmentConfig, **kwargs):
        self.config = config_class(**kwargs)

    def _workspace(self) -> Path:
        return Path(self.config.cwd or os.getcwd()).resolve()

    def _inner_cwd(self, workspace: Path, cwd: str) -> str:
        if not cwd:
            return "/workspace"
        p = Path(cwd)
        if not p.is_absolute():
            return str(Path("/workspace") / p)
        try:
            return str(Path("/workspace") / p.resolve().relative_to(workspace))
        except ValueError:
            return cwd  # a path of the cage itself (/tmp, /workspace/...)

    def cage_args(self, command: str, cwd: str, timeout: int) -> list[str]:
        """The arguments of `chio cage run` for `command`."""
        c = self.config
        ws = self._workspace()
        st = ws.stat()
        args = ["--workspace", str(ws), "--cwd", self._inner_cwd(ws, cwd)]
        args += ["--uid", str(c.uid if c.uid is not None else st.st_uid)]
        args += ["--gid", str(c.gid if c.gid is not None else st.st_gid)]
        args += ["--timeout", f"{timeout}s", "--memory", c.memory, "--pids", str(c.pids), "--cpus", c.cpus]
        args += ["--net", c.network]
        if c.image:
            args += ["--image", c.image, "--entrypoint", ""]
        if c.state_dir:
            args += ["--state-dir", c.state_dir]
        for k, v in c.env.items():
            args += ["--env", f"{k}={v}"]
        return args + ["--", "/bin/bash", "-c", command]

    def launch_request(self, command: str, cwd: str, timeout: int) -> dict:
        """The daemon's launch request for `command`: what `cage_args` says, as typed options."""
        c = self.config
        ws = self._workspace()
        st = ws.stat()
        options = {
            "argv": ["/bin/bash", "-c", command],
            "workspace": str(ws),
            "cwd": self._inner_cwd(ws, cwd),
            "uid": c.uid if c.uid is not None else st.st_uid,
            "gid": c.gid if c.gid is not None else st.st_gid,
            "net": c.network,
            "limits": {
                "wall_ms": timeout * 1000,
                "memory_bytes": common.size_bytes(c.memory),
                "pids": c.pids,
                "cpu_millis": common.cpu_millis(c.cpus),
            },
            "env": [f"{k}={v}" for k, v in c.env.items()],
        }
        if c.image:
            options["image"] = {"reference": c.image, "entrypoint": ""}
            if c.state_dir:
                options["image"]["store_dir"] = c.state_dir
        return {"launch": {"options": options}}

    def command_line(self, command: str, cwd: str, timeout: int, record: str) -> list[str]:
        """The `chio cage run` command line, writing its record to `record`."""
        args = self.cage_args(command, cwd, timeout)
        split = args.index("--")
        return [self.config.chio, "cage", "run"] + args[:split] + ["--record", record] + args[split:]

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        try:
            if self.config.supervisor:
                returncode, text, launch = self._requested(command, cwd, timeout)
            else:
                returncode, text, launch = self._spawned(command, cwd, timeout)
        except Exception as e:  # chio missing or refusing, the daemon unreachable, or a hang past the margin
            output = common.failed(e)
            common.check_finished(output)
            return output
        hit = (launch.get("outcome") or {}).get("limit_hit", [])
        if "wall_time" in hit:
            output = common.timed_out(command, timeout, text)
        elif launch.get("state") not in ("FullyEnforced", None) or not launch:
            output = common.failed(RuntimeError(f"the cage did not run the command: {launch.get('failure') or text}"), text)
        else:
            output = {"output": text, "returncode": returncode, "exception_info": ""}
        common.check_finished(output)
        return output

    def _spawned(self, command: str, cwd: str, timeout: int) -> tuple[int, str, dict]:
        """A `chio cage run` process: (status, output, launch record)."""
        # The launch record goes to a memfd, not a file: chio syncs a record file to disk, which
        # is a quarter of a launch here and buys nothing for a record read back at once.
        record = os.memfd_create("chio-record")
        try:
            argv = self.command_line(command, cwd, timeout, f"/dev/fd/{record}")
            # The cage enforces the timeout; the margin only guards against chio itself hanging.
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                timeout=timeout + 30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, pass_fds=(record,),
            )
            text = done.stdout.decode("utf-8", errors="replace")
            try:
                launch = json.loads(common.read_all(record) or b"{}")
            except ValueError:
                launch = {}
        finally:
            os.close(record)
        return done.returncode, text, launch

    def _requested(self, command: str, cwd: str, timeout: int) -> tuple[int, str, dict]:
        """One request to the supervisor daemon: (status, output, launch record). The command's
        stdout and stderr both go to one memfd (as the chio process's both go to one pipe), read
        back once the daemon answers: no reader thread, no pipe to fill."""
        out = os.memfd_create("chio-output")
        try:
            request = self.launch_request(command, cwd, timeout)
            reply = common.supervisor_request(self.config.supervisor, "launch", request, [out, out], timeout)
            if "error" in reply or "exit_status" not in reply:
                raise RuntimeError(f"the supervisor refused the command: {reply.get('error', reply)}")
            text = common.read_all(out).decode("utf-8", errors="replace")
        finally:
            os.close(out)
        return reply["exit_status"], text, reply.get("record") or {}

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return common.template_vars(self.config, **kwargs)

    def serialize(self) -> dict:
        return common.serialize(self)

