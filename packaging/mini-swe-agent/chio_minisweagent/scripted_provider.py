"""A scripted OpenAI-compatible provider: try a governed session without a model account.

  python3 -m chio_minisweagent.scripted_provider --port 8765 \\
      --command 'cd package && python3 -m unittest' --command '...' ...

Serves `POST /v1/chat/completions` on 127.0.0.1. The answer depends on the conversation, not on
how often it was asked: step N (N tool results so far) gets one `bash` tool call running the
N-th `--command`; past the script, the submit command. It needs no credential and reports on
stderr whether the gateway sent one (it should: the gateway adds it, the worker never has it).
"""

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def answer(commands: list[str], request: dict) -> dict:
    step = sum(1 for m in request.get("messages", []) if m.get("role") == "tool")
    command = commands[step] if step < len(commands) else SUBMIT
    call = {"id": f"call_{step}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return {
        "id": f"chatcmpl-{step}", "object": "chat.completion", "created": 0, "model": request.get("model", ""),
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": f"step {step}", "tool_calls": [call]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def handler(commands: list[str]) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if not self.path.endswith("/chat/completions"):
                self.send_error(404)
                return
            bearer = self.headers.get("Authorization", "").startswith("Bearer ")
            reply = json.dumps(answer(commands, json.loads(body))).encode()
            print(f"scripted provider: {self.path} (credential {'sent' if bearer else 'MISSING'})", file=sys.stderr)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--command", action="append", default=[], help="the next step's command (repeat)")
    a = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), handler(a.command))
    print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
