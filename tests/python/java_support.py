"""Helpers for the Java-client and Kafka-tools tests.

* Build-once of the two Maven projects (cached on disk, guarded by a file lock so parallel
  pytest workers build only once):
    - tests/java        -> target/sluice-java-tests-*.jar + target/lib/*.jar  (our test programs)
    - tests/kafka-tools -> lib/*.jar  (Apache Kafka 4.3.1 broker + tools, e.g. TopicCommand)
* Running a Java main class with a hard timeout (the whole process group is killed on timeout,
  so a hang fails the test instead of blocking CI), or in the background with its stdout lines
  collected as they arrive.
* TcpProxy: a real TCP proxy between client and broker that can cut every connection on demand,
  optionally right after a request has been forwarded (so the response is lost mid-flight).

Nothing here is mocked: real JVMs, real sockets.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import queue
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import free_port

REPO = Path(__file__).resolve().parents[2]
JAVA_DIR = REPO / "tests" / "java"
TOOLS_DIR = REPO / "tests" / "kafka-tools"
JAVA_HEAP = os.environ.get("SLUICE_TEST_JAVA_HEAP", "512m")
MVN = os.environ.get("MVN", "mvn")
JAVA = os.environ.get("JAVA", "java")
BUILD_TIMEOUT_S = 900


# ----------------------------------------------------------------------------- building


class _FileLock:
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def _run_build(cmd: list[str], cwd: Path) -> None:
    if shutil.which(cmd[0]) is None:
        pytest.fail(f"`{cmd[0]}` not found on PATH: install Maven (apt-get install -y maven openjdk-17-jdk-headless)")
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} (in {cwd}) timed out after {BUILD_TIMEOUT_S}s:\n{e.stdout}\n{e.stderr}")
    if r.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} (in {cwd}) failed with {r.returncode}:\n{r.stdout[-8000:]}\n{r.stderr[-8000:]}")


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(REPO)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


_java_cp: str | None = None
_tools_cp: str | None = None


def java_test_classpath() -> str:
    """Builds tests/java (if its pom or sources changed) and returns the classpath of the test programs."""
    global _java_cp
    if _java_cp is not None:
        return _java_cp
    target = JAVA_DIR / "target"
    with _FileLock(REPO / ".cache" / "java-build.lock"):
        inputs = [JAVA_DIR / "pom.xml", *[p for p in (JAVA_DIR / "src").rglob("*") if p.is_file()]]
        digest = _digest(inputs)
        stamp = target / ".sluice-build-digest"
        jars = sorted(target.glob("sluice-java-tests-*.jar"))
        if not (stamp.exists() and stamp.read_text() == digest and jars and any((target / "lib").glob("*.jar"))):
            _run_build(
                [MVN, "-q", "-B", "package", "dependency:copy-dependencies",
                 "-DoutputDirectory=target/lib", "-DincludeScope=runtime"],
                JAVA_DIR,
            )
            stamp.write_text(digest)
            jars = sorted(target.glob("sluice-java-tests-*.jar"))
        assert jars, "maven produced no jar"
    _java_cp = f"{jars[-1]}{os.pathsep}{target / 'lib'}/*"
    return _java_cp


def kafka_tools_classpath() -> str:
    """Resolves Apache Kafka 4.3.1 (broker + tools) into tests/kafka-tools/lib once; returns 'lib/*'."""
    global _tools_cp
    if _tools_cp is not None:
        return _tools_cp
    lib = TOOLS_DIR / "lib"
    with _FileLock(REPO / ".cache" / "kafka-tools.lock"):
        digest = _digest([TOOLS_DIR / "pom.xml"])
        stamp = lib / ".sluice-deps-digest"
        if not (stamp.exists() and stamp.read_text() == digest):
            shutil.rmtree(lib, ignore_errors=True)
            _run_build(
                [MVN, "-q", "-B", "dependency:copy-dependencies", "-DoutputDirectory=lib", "-DincludeScope=runtime"],
                TOOLS_DIR,
            )
            stamp.write_text(digest)
        if not list(lib.glob("kafka-tools-*.jar")):
            pytest.fail(f"kafka-tools jar missing from {lib}")
    _tools_cp = f"{lib}/*"
    return _tools_cp


@pytest.fixture(scope="session")
def java_cp() -> str:
    return java_test_classpath()


@pytest.fixture(scope="session")
def tools_cp() -> str:
    return kafka_tools_classpath()


# ----------------------------------------------------------------------------- running


def java_cmd(cp: str, main_class: str, args=(), heap: str = JAVA_HEAP, jvm_args=()) -> list[str]:
    return [JAVA, f"-Xmx{heap}", "-XX:+UseSerialGC", *jvm_args, "-cp", cp, main_class,
            *[str(a) for a in args]]


@dataclass
class JavaResult:
    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def report(self, tail: int = 6000) -> str:
        """Everything needed to understand a failure, for assertion messages."""
        return (f"$ {' '.join(self.cmd)}\nexit code {self.returncode} after {self.seconds:.1f}s\n"
                f"--- stdout (tail) ---\n{self.stdout[-tail:]}\n--- stderr (tail) ---\n{self.stderr[-tail:]}")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group we created for this child (start_new_session=True)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_java(cp: str, main_class: str, args=(), timeout: float = 120, heap: str = JAVA_HEAP, jvm_args=(),
             cwd: Path | None = None) -> JavaResult:
    """Runs a Java main class to completion; a run longer than `timeout` is killed and fails the test."""
    cmd = java_cmd(cp, main_class, args, heap, jvm_args)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        res = JavaResult(cmd, -9, out, err, time.monotonic() - t0)
        pytest.fail(f"{main_class} did not finish within {timeout}s (killed)\n{res.report()}")
    return JavaResult(cmd, proc.returncode, out, err, time.monotonic() - t0)


class JavaProcess:
    """A Java main class running in the background; stdout lines are collected as they arrive."""

    def __init__(self, cp: str, main_class: str, args=(), heap: str = JAVA_HEAP, jvm_args=(), stdin: bool = False):
        self.cmd = java_cmd(cp, main_class, args, heap, jvm_args)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE if stdin else None, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self._err: list[str] = []
        self._t_out = threading.Thread(target=self._pump_out, daemon=True)
        self._t_err = threading.Thread(target=self._pump_err, daemon=True)
        self._t_out.start()
        self._t_err.start()

    def _pump_out(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append((time.monotonic(), line))
            self._q.put(line)
        self._q.put(None)

    def _pump_err(self):
        for line in self.proc.stderr:
            self._err.append(line)

    @property
    def stdout(self) -> str:
        return "\n".join(l for _, l in self.lines)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    def send(self, line: str) -> None:
        """Writes one line to the program's stdin (started with stdin=True)."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def seen(self, prefix: str) -> bool:
        return any(l.startswith(prefix) for _, l in self.lines)

    def wait_for_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                pytest.fail(f"no line starting with {prefix!r} within {timeout}s\n{self.result().report()}")
            try:
                line = self._q.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait()
                pytest.fail(f"process ended before printing {prefix!r}\n{self.result().report()}")
            if line.startswith(prefix):
                return line

    def wait(self, timeout: float) -> JavaResult:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.cmd[-1]} did not finish within {timeout}s (killed)\n{self.result().report()}")
        return self.result()

    def result(self) -> JavaResult:
        self._t_out.join(timeout=5)
        self._t_err.join(timeout=5)
        rc = self.proc.returncode if self.proc.returncode is not None else -1
        return JavaResult(self.cmd, rc, self.stdout, self.stderr, time.monotonic() - self.t0)

    def kill(self):
        if self.proc.poll() is None:
            _kill_group(self.proc)
            self.proc.wait()


# ----------------------------------------------------------------------------- TCP proxy


@dataclass
class _Pair:
    client: socket.socket
    server: socket.socket
    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    closed: bool = False
    # client->broker request framing
    hdr: bytearray = field(default_factory=bytearray)
    remaining: int = 0
    api_key: int = -1


class TcpProxy:
    """Forwards 127.0.0.1:<port> to 127.0.0.1:<target_port>, one selector thread, real sockets.

    drop_all(): abort every open connection now (RST, or FIN with rst=False).
    drop_after_next_request(delay): abort every connection `delay` seconds after the last byte of
    the next complete client->broker request with the given API key (0 = Produce) has been
    forwarded, i.e. while that request is in flight on the broker. From that moment until the
    action has run, nothing goes back to the client, so its response (if the broker sent it
    already) never reaches the client and the request is in flight from the client's view too.
    The proxy follows Kafka's request framing (4-byte size, then the 2-byte API key) on the
    client->broker direction to know where requests end.
    call_after_next_request(fn, delay, cut): the same trigger running any action (e.g. SIGKILL the
    broker), then, with cut, aborting every connection (discarding the held responses).
    """

    BUF_LIMIT = 4 << 20

    def __init__(self, target_port: int, port: int | None = None):
        self.target = ("127.0.0.1", target_port)
        self.port = port or free_port()
        self._lsock = socket.socket()
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", self.port))
        self._lsock.listen(128)
        self._lsock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._lsock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pairs: list[_Pair] = []
        self._cmds: queue.Queue = queue.Queue()
        self._armed: tuple[float, int, object] | None = None  # (delay, api_key, action)
        self._action_at: tuple[float, object] | None = None  # (monotonic due time, action)
        self.action_errors: list[BaseException] = []
        self._running = True
        # statistics
        self.accepted = 0
        self.drop_events: list[tuple[float, int]] = []  # (monotonic time, connections cut)
        self.bytes_up = 0
        self.bytes_down = 0
        self.requests: dict[int, int] = {}  # api key -> complete requests forwarded
        self.requests_since_drop: dict[int, int] = {}
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- public commands (thread-safe)

    def drop_all(self, rst: bool = True) -> None:
        done = threading.Event()
        self._cmds.put(("drop", rst, done))
        self._wake_w.send(b"x")
        done.wait(5)

    def drop_after_next_request(self, delay: float = 0.0, rst: bool = True, api_key: int = 0) -> None:
        self.call_after_next_request(lambda: self._drop(rst), delay, api_key)

    def call_after_next_request(self, action, delay: float = 0.0, api_key: int = 0, cut: bool = False) -> None:
        """Runs `action()` on the proxy thread `delay` s after the next complete request with this
        API key has been forwarded to the broker (e.g. to SIGKILL the broker while it handles it);
        responses are held back until then. With `cut`, every connection is then aborted, so the
        client never sees an answer to that request and must retry it."""
        if cut:
            inner = action

            def action():
                try:
                    inner()
                finally:
                    self._drop(True)
        done = threading.Event()
        self._cmds.put(("arm", (delay, api_key, action), done))
        self._wake_w.send(b"x")
        done.wait(5)

    def _holding_responses(self) -> bool:
        return self._action_at is not None

    def armed(self) -> bool:
        return self._armed is not None or self._action_at is not None

    def live_connections(self) -> int:
        return len(self._pairs)

    def wait_for_traffic(self, api_key: int = 0, timeout: float = 15.0) -> bool:
        """Waits until a request with this API key went through since the last cut (and its
        connection is still open): the client is connected and working again."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.requests_since_drop.get(api_key, 0) > 0 and self._pairs:
                return True
            time.sleep(0.005)
        return False

    def close(self) -> None:
        self._running = False
        self._wake_w.send(b"x")
        self._thread.join(5)
        for p in list(self._pairs):
            self._close_pair(p, rst=True)
        self._sel.close()
        self._lsock.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- selector loop

    def _loop(self):
        while self._running:
            timeout = 0.05
            if self._action_at is not None:
                timeout = max(0.0, min(timeout, self._action_at[0] - time.monotonic()))
            for key, mask in self._sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    self._commands()
                else:
                    pair, side = key.data
                    if not pair.closed:
                        self._io(pair, side, mask)
            if self._action_at is not None and time.monotonic() >= self._action_at[0]:
                action = self._action_at[1]
                try:
                    action()
                except BaseException as e:  # reported by the test, never kills the proxy
                    self.action_errors.append(e)
                self._action_at = None

    def _commands(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                cmd, arg, done = self._cmds.get_nowait()
            except queue.Empty:
                return
            if cmd == "drop":
                self._drop(arg)
                done.set()
            elif cmd == "arm":
                self._armed = arg
                done.set()

    def _accept(self):
        try:
            c, _ = self._lsock.accept()
        except BlockingIOError:
            return
        try:
            s = socket.create_connection(self.target, timeout=2)
        except OSError:
            self._abort(c)
            return
        for sock in (c, s):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(c, s)
        self._pairs.append(pair)
        self.accepted += 1
        self._sel.register(c, selectors.EVENT_READ, (pair, "client"))
        self._sel.register(s, selectors.EVENT_READ, (pair, "server"))

    def _io(self, pair: _Pair, side: str, mask: int):
        src = pair.client if side == "client" else pair.server
        out = pair.to_server if side == "client" else pair.to_client
        dst = pair.server if side == "client" else pair.client
        if side == "server" and self._holding_responses():
            mask &= ~selectors.EVENT_READ
        if mask & selectors.EVENT_READ:
            try:
                data = src.recv(256 * 1024)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data == b"":
                self._close_pair(pair, rst=False)
                return
            if data:
                out += data
                if side == "client":
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                if not self._flush(pair, dst, out):
                    return
                if side == "client":
                    for api in self._frame(pair, data):
                        self.requests[api] = self.requests.get(api, 0) + 1
                        self.requests_since_drop[api] = self.requests_since_drop.get(api, 0) + 1
                        if self._armed is not None and api == self._armed[1]:
                            delay, _, action = self._armed
                            self._armed = None
                            self._action_at = (time.monotonic() + delay, action)
        if mask & selectors.EVENT_WRITE:
            own_out = pair.to_client if side == "client" else pair.to_server
            if not self._flush(pair, src, own_out):
                return
        self._update(pair)

    @staticmethod
    def _frame(pair: _Pair, data: bytes) -> list[int]:
        """API keys of the client->broker requests completed by this chunk."""
        done = []
        i = 0
        while i < len(data):
            if pair.remaining == 0:
                take = data[i:i + 6 - len(pair.hdr)]
                pair.hdr += take
                i += len(take)
                if len(pair.hdr) == 6:
                    size = int.from_bytes(pair.hdr[:4], "big", signed=True)
                    pair.api_key = int.from_bytes(pair.hdr[4:6], "big", signed=True)
                    pair.remaining = max(0, size - 2)
                    pair.hdr.clear()
                    if pair.remaining == 0:
                        done.append(pair.api_key)
            else:
                take = min(pair.remaining, len(data) - i)
                pair.remaining -= take
                i += take
                if pair.remaining == 0:
                    done.append(pair.api_key)
        return done

    def _flush(self, pair: _Pair, sock: socket.socket, buf: bytearray) -> bool:
        while buf:
            try:
                n = sock.send(buf)
            except BlockingIOError:
                break
            except OSError:
                self._close_pair(pair, rst=False)
                return False
            del buf[:n]
        self._update(pair)
        return True

    def _update(self, pair: _Pair):
        if pair.closed:
            return
        for sock, own_out, peer_out, side in (
            (pair.client, pair.to_client, pair.to_server, "client"),
            (pair.server, pair.to_server, pair.to_client, "server"),
        ):
            ev = 0
            if len(peer_out) < self.BUF_LIMIT:
                ev |= selectors.EVENT_READ
            if own_out:
                ev |= selectors.EVENT_WRITE
            if ev == 0:
                ev = selectors.EVENT_WRITE  # cannot happen in practice; keep registered
            try:
                self._sel.modify(sock, ev, (pair, side))
            except (KeyError, ValueError):
                pass

    @staticmethod
    def _abort(sock: socket.socket):
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        sock.close()

    def _close_pair(self, pair: _Pair, rst: bool):
        if pair.closed:
            return
        pair.closed = True
        for sock in (pair.client, pair.server):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            if rst:
                self._abort(sock)
            else:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        if pair in self._pairs:
            self._pairs.remove(pair)

    def _drop(self, rst: bool):
        pairs = list(self._pairs)
        for p in pairs:
            self._close_pair(p, rst)
        self.drop_events.append((time.monotonic(), len(pairs)))
        self.requests_since_drop = {}


if __name__ == "__main__":
    # Prefetch / build both Maven projects (what the tests would do on first use), e.g. in CI:
    #   .venv/bin/python tests/python/java_support.py
    print("java test programs:", java_test_classpath())
    print("kafka tools:", kafka_tools_classpath())
