"""The environments under mini-swe-agent's own DefaultAgent and DeterministicModel (scripted
actions), against real chio cages: the calculator fixed and submitted, and hostile actions
prevented — each with a control showing it succeeds under mini-swe-agent's local environment.

Needs root and a built chio: CHIO_BIN names it (the Rust suite `tests/tests/minisweagent.rs`
runs this file with the freshly built binary)."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from pathlib import Path

from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.test_models import DeterministicModel, make_output

from chio_minisweagent import common
from chio_minisweagent import ChioEnvironment, ChioRepositoryEnvironment

CHIO = os.environ.get("CHIO_BIN", "chio")
NOBODY = 65534
CALC = "def add(a, b):\n    return a - b\n"
TEST = "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
FIX = "sed -i 's/return a - b/return a + b  # fixed/' calc.py"
# The calculator task in the working directory: fail, fix, pass, submit.
CALCULATOR = [
    "python3 -m unittest 2>&1 | tail -1",
    FIX,
    "python3 -m unittest 2>&1 | tail -1",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
]


def git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd, check=True,
                   capture_output=True, env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"})


def run_agent(env, commands, task="fix add"):
    outputs = [make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(commands)]
    agent = DefaultAgent(DeterministicModel(outputs=outputs), env, system_template="You run commands.",
                         instance_template="{{task}}", cost_limit=0, step_limit=len(commands) + 1)
    return agent, agent.run(task)


def observations(agent):
    return [m["content"] for m in agent.messages if m.get("role") == "user"][1:]


class Base(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            if os.environ.get("CI") == "true":
                self.fail("needs root (CI=true forbids skipping)")
            self.skipTest("needs root: chio builds cages")
        self.tmp = Path(tempfile.mkdtemp(prefix="chio-msa-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.ws = self.tmp / "work"
        self.ws.mkdir()
        (self.ws / "calc.py").write_text(CALC)
        (self.ws / "test_calc.py").write_text(TEST)
        for p in [self.ws, *self.ws.iterdir()]:
            os.chown(p, NOBODY, NOBODY)
        self.tmp.chmod(0o755)


class TestChioEnvironment(Base):
    def env(self, **kw):
        return ChioEnvironment(chio=CHIO, cwd=str(self.ws), timeout=20, **kw)

    def test_calculator_fixed_and_submitted(self):
        agent, result = run_agent(self.env(), CALCULATOR)
        self.assertEqual(result["exit_status"], "Submitted", agent.messages[-1])
        obs = observations(agent)
        self.assertIn("FAILED", obs[0])
        self.assertIn("OK", obs[2])
        self.assertIn("# fixed", (self.ws / "calc.py").read_text())
        self.assertEqual((self.ws / "calc.py").stat().st_uid, NOBODY, "the edit landed as another user")

    def test_timeout_gives_minus_one_and_kills_everything(self):
        marker = f"sleep 300.{os.getpid()}"
        env = ChioEnvironment(chio=CHIO, cwd=str(self.ws), timeout=2)
        out = env.execute({"command": f"({marker} &) ; {marker}"})
        self.assertEqual(out["returncode"], -1)
        self.assertIn("timed out after 2 seconds", out["exception_info"])
        self.assertEqual(live(marker), [])

    def test_serialize_and_template_vars(self):
        env = self.env(env={"A": "1"})
        self.assertEqual(env.serialize()["info"]["config"]["environment_type"], "chio_minisweagent.cage.ChioEnvironment")
        vars = env.get_template_vars(task="t")
        self.assertEqual((vars["task"], vars["timeout"], vars["env"]), ("t", 20, {"A": "1"}))
        self.assertNotIn("PATH", vars, "the agent's own environment leaked into template variables")


class TestChioEnvironmentThroughTheSupervisor(Base):
    """The same environment with `supervisor` set: each command is a request on the daemon's
    socket (no chio process per command), with the same results."""

    def setUp(self):
        super().setUp()
        self.socket = start_supervisor(self, self.tmp)

    def env(self, **kw):
        return ChioEnvironment(chio="/nonexistent/chio", supervisor=self.socket, cwd=str(self.ws), timeout=20, **kw)

    def test_calculator_fixed_and_submitted(self):
        agent, result = run_agent(self.env(), CALCULATOR)
        self.assertEqual(result["exit_status"], "Submitted", agent.messages[-1])
        obs = observations(agent)
        self.assertIn("FAILED", obs[0])
        self.assertIn("OK", obs[2])
        self.assertEqual((self.ws / "calc.py").stat().st_uid, NOBODY, "the edit landed as another user")

    def test_timeout_both_streams_and_no_agent_secret(self):
        marker = f"sleep 302.{os.getpid()}"
        out = ChioEnvironment(supervisor=self.socket, cwd=str(self.ws), timeout=2).execute({"command": f"({marker} &) ; {marker}"})
        self.assertEqual(out["returncode"], -1)
        self.assertIn("timed out after 2 seconds", out["exception_info"])
        self.assertEqual(live(marker), [])
        os.environ["CHIO_MSA_TEST_SECRET"] = "hunter2-from-the-agent"
        self.addCleanup(os.environ.pop, "CHIO_MSA_TEST_SECRET")
        out = self.env().execute({"command": "echo one; echo two >&2; echo three; echo \"[$CHIO_MSA_TEST_SECRET]\"; exit 3"})
        # Both streams reach the output (each in its order; the cage pumps them apart, as the
        # chio process does) and nothing of the agent's environment.
        self.assertEqual(out["returncode"], 3)
        self.assertEqual(sorted(out["output"].splitlines()), ["[]", "one", "three", "two"])
        self.assertLess(out["output"].index("one"), out["output"].index("three"))


    def test_a_kept_connection_the_daemon_closed_is_replaced(self):
        """An environment keeps its connection for the next command; one the daemon closed while
        the agent thought (here its 1 s idle limit) is replaced, and the command runs once."""
        sock = start_supervisor(self, self.tmp / "idle", {"request_timeout_s": 1})
        env = ChioEnvironment(supervisor=sock, cwd=str(self.ws), timeout=20)
        self.assertEqual(env.execute({"command": "echo one >> count; cat count"})["output"], "one\n")
        first = common._connections[sock]
        self.assertEqual(env.execute({"command": "echo two >> count; cat count"})["output"], "one\ntwo\n")
        self.assertIs(common._connections[sock], first, "the second command went on the kept connection")
        time.sleep(1.5)
        out = env.execute({"command": "echo three >> count; cat count"})
        self.assertEqual(out["output"], "one\ntwo\nthree\n", out)
        self.assertIsNot(common._connections[sock], first, "the closed connection was replaced")


class TestHostileActions(Base):
    """Each probe under chio is refused; the same probe under the local environment succeeds."""

    def both(self, command):
        chio = ChioEnvironment(chio=CHIO, cwd=str(self.ws), timeout=20).execute({"command": command})
        local = LocalEnvironment(cwd=str(self.ws), timeout=20).execute({"command": command})
        return chio, local

    def test_reading_outside_the_workspace(self):
        secret = self.tmp / "outside-secret.txt"
        secret.write_text("TOP-SECRET-CONTENT\n")
        chio, local = self.both(f"cat {secret}")
        self.assertNotIn("TOP-SECRET-CONTENT", chio["output"])
        self.assertNotEqual(chio["returncode"], 0)
        self.assertIn("TOP-SECRET-CONTENT", local["output"])

    def test_writing_outside_the_workspace(self):
        target = self.tmp / "planted.txt"
        out = ChioEnvironment(chio=CHIO, cwd=str(self.ws), timeout=20).execute({"command": f"echo x > {target}"})
        self.assertNotEqual(out["returncode"], 0)
        self.assertFalse(target.exists())
        LocalEnvironment(cwd=str(self.ws)).execute({"command": f"echo x > {target}"})
        self.assertTrue(target.exists(), "control: the local environment could not write there")

    def test_connecting_to_a_host_loopback_listener(self):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        accepted = []

        def accept():
            try:
                while True:
                    accepted.append(server.accept())
            except OSError:
                pass  # closed at the end of the test

        threading.Thread(target=accept, daemon=True).start()
        probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2); print('CONNECTED')\""
        chio, local = self.both(probe)
        self.assertNotIn("CONNECTED", chio["output"])
        self.assertIn("CONNECTED", local["output"])
        wait_for(lambda: accepted)
        time.sleep(0.2)
        self.assertEqual(len(accepted), 1, "only the local control may reach the listener")
        server.close()

    def test_detached_background_processes(self):
        marker = f"sleep 301.{os.getpid()}"
        burst = f"for i in $(seq 10); do setsid nohup {marker} >/dev/null 2>&1 & done; ({marker} &) ; echo started"
        chio = ChioEnvironment(chio=CHIO, cwd=str(self.ws), timeout=20).execute({"command": burst})
        self.assertIn("started", chio["output"])
        self.assertEqual(live(marker), [], "the cage's processes outlived the command")
        LocalEnvironment(cwd=str(self.ws)).execute({"command": burst})
        try:
            # The detached processes exec their sleep on their own time.
            wait_for(lambda: len(live(marker)) >= 10)
            self.assertGreaterEqual(len(live(marker)), 10, "control: the local environment left none running")
        finally:
            subprocess.run(["pkill", "-f", marker])

    def test_printing_a_secret_from_the_agents_environment(self):
        os.environ["CHIO_MSA_TEST_SECRET"] = "hunter2-from-the-agent"
        self.addCleanup(os.environ.pop, "CHIO_MSA_TEST_SECRET")
        chio, local = self.both("echo \"[$CHIO_MSA_TEST_SECRET]\"; env")
        self.assertNotIn("hunter2", chio["output"])
        self.assertIn("hunter2", local["output"])


class TestChioRepositoryEnvironment(Base):
    def setUp(self):
        super().setUp()
        self.repo = self.tmp / "repo"
        (self.repo / "package").mkdir(parents=True)
        (self.repo / "package" / "calc.py").write_text(CALC)
        (self.repo / "package" / "test_calc.py").write_text(TEST)
        git(self.repo, "init", "-q")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-qm", "calculator")
        self.key = self.tmp / "key"
        subprocess.run([CHIO, "keys", "generate", "--out", str(self.key)], check=True, capture_output=True)
        self.state = self.tmp / "state"
        subprocess.run([CHIO, "repository", "init", "--state", str(self.state), "--repository", str(self.repo),
                        "--revision", "HEAD", "--source-path", "package", "--kernel-key",
                        str(self.key / "signing.seed")], check=True, capture_output=True)

    def receipts(self):
        out = subprocess.run([CHIO, "repository", "status", "--state", str(self.state), "--json"], check=True,
                             capture_output=True)
        return json.loads(out.stdout)["receipts"]

    def test_calculator_submitted_exported_verified_and_replayed(self):
        commands = [
            "cd package && python3 -m unittest 2>&1 | tail -1",
            f"cd package && {FIX}",
            "cd package && python3 -m unittest 2>&1 | tail -1",
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
        ]
        bundle = self.tmp / "bundle"
        env = ChioRepositoryEnvironment(chio=CHIO, state_dir=str(self.state), run_id="r1", export_dir=str(bundle))
        agent, result = run_agent(env, commands)
        self.assertEqual(result["exit_status"], "Submitted")
        obs = observations(agent)
        self.assertIn("FAILED", obs[0])
        self.assertIn("OK", obs[2])
        recipient = self.tmp / "recipient"
        git(self.tmp, "clone", "-q", str(self.repo), str(recipient))
        verify = subprocess.run([CHIO, "repository", "verify-export", "--bundle", str(bundle), "--repository",
                                 str(recipient), "--revision", "HEAD", "--source-path", "package", "--kernel-key",
                                 str(self.key / "public.key")], capture_output=True)
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertEqual(json.loads(verify.stdout)["verified_transitions"], 4)
        # A resumed run with the same id replays every completed step: no new launch, no receipt.
        before = self.receipts()
        env2 = ChioRepositoryEnvironment(chio=CHIO, state_dir=str(self.state), run_id="r1")
        agent2, result2 = run_agent(env2, commands)
        self.assertEqual(result2["exit_status"], "Submitted")
        self.assertEqual(self.receipts(), before, "a resumed run launched again")

    def test_through_the_supervisor(self):
        """Each command one request on the daemon's socket: no chio process on the agent's side."""
        sock = start_supervisor(self, self.tmp)
        before = self.receipts()
        env = ChioRepositoryEnvironment(chio="/nonexistent/chio", supervisor=sock, state_dir=str(self.state), run_id="r3")
        agent, result = run_agent(env, [
            "cd package && python3 -m unittest 2>&1 | tail -1",
            f"cd package && {FIX}",
            "cd package && python3 -m unittest 2>&1 | tail -1",
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
        ])
        self.assertEqual(result["exit_status"], "Submitted", agent.messages[-1])
        obs = observations(agent)
        self.assertIn("FAILED", obs[0])
        self.assertIn("OK", obs[2])
        self.assertGreater(self.receipts(), before, "the commands were not receipted in the workspace")
        out = env.execute({"command": "echo x > outside.txt"})
        self.assertEqual(out["returncode"], 3)

    def test_a_change_outside_the_scope_is_refused(self):
        env = ChioRepositoryEnvironment(chio=CHIO, state_dir=str(self.state), run_id="r2")
        out = env.execute({"command": "echo x > outside.txt"})
        self.assertEqual(out["returncode"], 3)
        self.assertIn("refused", out["output"])


def start_supervisor(test, tmp, config=None):
    """A daemon in the foreground on a private socket and state (root connects as admin), with
    `config`'s settings; it is stopped when `test` ends. Returns the socket's path."""
    tmp.mkdir(exist_ok=True)
    sock = str(tmp / "s.sock")
    conf = tmp / "supervisor.json"
    conf.write_text(json.dumps({"schema": "chio.supervisor-config.v1", **(config or {})}))
    log = open(tmp / "daemon.log", "w+")
    test.addCleanup(log.close)
    daemon = subprocess.Popen([CHIO, "supervisor", "serve", "--socket", sock, "--config", str(conf),
                               "--state-dir", str(tmp / "daemon-state")], stdin=subprocess.DEVNULL, stderr=log)
    test.addCleanup(daemon.wait)
    test.addCleanup(daemon.terminate)
    wait_for(lambda: "listening on" in (tmp / "daemon.log").read_text())
    return sock


def wait_for(condition, seconds=10):
    until = time.monotonic() + seconds
    while not condition() and time.monotonic() < until:
        time.sleep(0.02)


def live(marker):
    """Processes whose command line holds `marker`, but for chio's janitor: a fork of the
    supervisor with its command line, which may still be removing the launch's cgroup for a
    moment after chio exited (it is no cage process)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if marker in cmd and "pkill" not in cmd and comm != "chio-janitor":
            found.append(pid)
    return found


if __name__ == "__main__":
    unittest.main()
