"""`ChioEnvironment`: each command in a fresh chio cage (`chio cage run`).

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

    def command_line(self, command: str, cwd: str, timeout: int, record: str) -> list[str]:
        c = self.config
        ws = self._workspace()
        st = ws.stat()
        argv = [c.chio, "cage", "run", "--workspace", str(ws), "--cwd", self._inner_cwd(ws, cwd)]
        argv += ["--uid", str(c.uid if c.uid is not None else st.st_uid)]
        argv += ["--gid", str(c.gid if c.gid is not None else st.st_gid)]
        argv += ["--timeout", f"{timeout}s", "--memory", c.memory, "--pids", str(c.pids), "--cpus", c.cpus]
        argv += ["--net", c.network, "--record", record]
        if c.image:
            argv += ["--image", c.image, "--entrypoint", ""]
        if c.state_dir:
            argv += ["--state-dir", c.state_dir]
        for k, v in c.env.items():
            argv += ["--env", f"{k}={v}"]
        return argv + ["--", "/bin/bash", "-c", command]

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        # The launch record goes to a memfd, not a file: chio syncs a record file to disk, which
        # is a quarter of a launch here and buys nothing for a record read back at once.
        record = os.memfd_create("chio-record")
        try:
            argv = self.command_line(command, cwd, timeout, f"/dev/fd/{record}")
            try:
                # The cage enforces the timeout; the margin only guards against chio itself hanging.
                done = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    timeout=timeout + 30, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, pass_fds=(record,),
                )
            except Exception as e:  # chio missing, or hung past the margin
                output = common.failed(e)
                common.check_finished(output)
                return output
            text = done.stdout.decode("utf-8", errors="replace")
            os.lseek(record, 0, os.SEEK_SET)
            with os.fdopen(os.dup(record), "rb") as f:
                raw = f.read()
            try:
                launch = json.loads(raw or b"{}")
            except ValueError:
                launch = {}
        finally:
            os.close(record)
        hit = (launch.get("outcome") or {}).get("limit_hit", [])
        if "wall_time" in hit:
            output = common.timed_out(command, timeout, text)
        elif launch.get("state") not in ("FullyEnforced", None) or not launch:
            output = common.failed(RuntimeError(f"the cage did not run the command: {launch.get('failure') or text}"), text)
        else:
            output = {"output": text, "returncode": done.returncode, "exception_info": ""}
        common.check_finished(output)
        return output

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return common.template_vars(self.config, **kwargs)

    def serialize(self) -> dict:
        return common.serialize(self)
