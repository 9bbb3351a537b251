"""The worker of a governed session: mini-swe-agent, in its own cage, holding nothing.

`chio session run` launches `python -m chio_minisweagent.worker /chio-session/worker.json` in
a cage with no network (loopback only) and no credential. It reaches the repository leg through
the leg's Unix socket (`ChioRepositoryEnvironment(socket=...)`) and the model through the
gateway's Unix socket: litellm speaks HTTP to a loopback port inside the cage, and this process
copies those bytes to the gateway's socket, which adds the credential on the host side.
"""

import json
import socket
import sys
import threading
from pathlib import Path


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _forward(listener: socket.socket, unix_path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(unix_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def model_port(unix_path: str, port: int) -> int:
    """Listen on the loopback port that forwards to the gateway's socket; returns it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(8)
    threading.Thread(target=_forward, args=(listener, unix_path), daemon=True).start()
    return listener.getsockname()[1]


def main(settings_path: str) -> int:
    settings = json.loads(Path(settings_path).read_text())
    port = model_port(settings["model_socket"], settings["model_port"])

    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.models.litellm_model import LitellmModel

    from chio_minisweagent.repository import ChioRepositoryEnvironment

    config = yaml.safe_load((builtin_config_dir / "mini.yaml").read_text())
    model_config = {k: v for k, v in config.get("model", {}).items() if k in ("observation_template", "format_error_template")}
    class GatewayRefusal(Exception):
        """The session's gateway refused the call (403: a budget, the grant, the step limit, a
        diverged journal): asking again gets the same answer, so the agent stops here."""

    class GatewayModel(LitellmModel):
        # litellm reports an OpenAI-compatible 403 as a generic APIError, which mini-swe-agent
        # retries for minutes; the gateway's 403 is final.
        abort_exceptions = [*LitellmModel.abort_exceptions, GatewayRefusal]

        def _query(self, messages, **kwargs):
            import litellm

            try:
                return super()._query(messages, **kwargs)
            except litellm.exceptions.APIError as e:
                if getattr(e, "status_code", None) == 403:
                    raise GatewayRefusal(str(e)) from e
                raise

    model = GatewayModel(
        model_name=f"openai/{settings['model_name']}",
        model_kwargs={"api_base": f"http://127.0.0.1:{port}/v1", "api_key": "held-by-the-gateway"},
        cost_tracking="ignore_errors",
        **model_config,
    )
    env = ChioRepositoryEnvironment(socket=settings["leg_socket"], run_id=settings["run_id"],
                                    timeout=settings["command_timeout_s"])
    agent_config = {k: v for k, v in config.get("agent", {}).items() if k in ("system_template", "instance_template")}
    agent = DefaultAgent(model, env, step_limit=settings["step_limit"], cost_limit=0,
                         wall_time_limit_seconds=settings["wall_time_s"],
                         output_path=Path(settings["trajectory"]), **agent_config)
    result = agent.run(settings["task"])
    return 0 if result.get("exit_status") == "Submitted" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
