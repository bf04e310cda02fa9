"""A local Confluent-compatible Schema Registry for development and tests, with no Docker:
Apicurio Registry (its `/apis/ccompat/v7` API) built from Maven Central jars.

Apicurio publishes its server as a library jar (`apicurio-registry-app`), not as a runnable
application, so `registry-pom.xml` depends on it and runs Quarkus' build once per version
into the user cache dir (a few hundred MB of jars, about 40 s with an empty Maven
repository). The registry then runs detached like the local broker, keeping its schemas in
memory (H2): a restart forgets them, which is what a test registry should do. Why this
version, and what the pom works around: docs/decisions/local-schema-registry.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs

from sluicegate.ops.localkafka.broker import MIN_JAVA, BrokerError
from sluicegate.ops.localkafka.processes import (
    HOST,
    alive,
    cmdline,
    find_java,
    find_maven,
    port_in_use,
    start_detached,
    tail,
    terminate,
)

APICURIO_VERSION = "2.4.2.Final"
DEFAULT_REGISTRY_PORT = 8081
CCOMPAT_PATH = "/apis/ccompat/v7"  # where Apicurio serves the Confluent REST API

_PACKAGE = "sluicegate.ops.localkafka"
_RUNNER = "registry-runtime-1-runner.jar"  # what the pom's Quarkus build produces
# C1 only and a small serial heap: it starts in ~5 s instead of ~8 s on two busy cores, and
# a test registry never runs long enough for C2 to pay off.
JVM_OPTS = ("-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true")


class RegistryServerError(BrokerError):
    """Anything that stops the local schema registry from building, starting or stopping."""


@dataclass(frozen=True, slots=True)
class LocalRegistry:
    port: int
    data_dir: Path
    pid: int
    already_running: bool = False

    @property
    def url(self) -> str:
        """What `SLUICEGATE_SCHEMA_REGISTRY_URL` is set to for this registry."""
        return registry_url(self.port)

    @property
    def log_path(self) -> Path:
        return self.data_dir / "registry.log"


def registry_url(port: int) -> str:
    return f"http://{HOST}:{port}{CCOMPAT_PATH}"


def default_registry_dir(port: int = DEFAULT_REGISTRY_PORT) -> Path:
    return Path(platformdirs.user_data_dir("sluicegate")) / f"registry-{port}"


def registry_cache_dir(version: str = APICURIO_VERSION) -> Path:
    return Path(platformdirs.user_cache_dir("sluicegate")) / f"apicurio-registry-{version}"


def registry_answers(url: str, timeout: float = 1.0) -> bool:
    """True if a Confluent-compatible registry at `url` lists its subjects."""
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def build_registry(version: str = APICURIO_VERSION) -> Path:
    """The runnable registry jar; runs Maven (and Quarkus' build) only the first time."""
    cache = registry_cache_dir(version)
    runner = cache / "app" / _RUNNER
    if (cache / ".complete").exists():
        return runner
    mvn = find_maven(f"build Apicurio Registry {version} into {cache}", RegistryServerError)
    find_java(MIN_JAVA, "the schema registry", RegistryServerError)
    cache.mkdir(parents=True, exist_ok=True)
    pom = resources.files(_PACKAGE).joinpath("registry-pom.xml").read_text()
    pom = re.sub(r"(<apicurio.version>)[^<]*(</apicurio.version>)", rf"\g<1>{version}\2", pom)
    # Built in a private dir and renamed at the end, so an interrupted or concurrent build
    # never leaves an app/ that looks complete.
    build = cache / f"build.{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir()
    (build / "pom.xml").write_text(pom)
    cmd = [mvn, "-q", "-B", "-f", str(build / "pom.xml"), "package", "-DskipTests"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    target = build / "target"
    if result.returncode != 0 or not (target / _RUNNER).exists():
        shutil.rmtree(build, ignore_errors=True)
        raise RegistryServerError(
            f"Maven could not build Apicurio Registry {version} (exit {result.returncode}):\n"
            + tail(result.stdout + result.stderr))
    app = build / "app"
    app.mkdir()
    (target / _RUNNER).rename(app / _RUNNER)
    (target / "lib").rename(app / "lib")
    shutil.rmtree(cache / "app", ignore_errors=True)
    app.rename(cache / "app")
    shutil.rmtree(build, ignore_errors=True)
    (cache / ".complete").write_text(version + "\n")
    return runner


def _pid_path(data_dir: Path) -> Path:
    return data_dir / "registry.pid"


def _marker(data_dir: Path) -> str:
    # On the command line, so a pid file's process can be told to be this registry.
    return f"-Dsluicegate.registry.dir={data_dir}"


def _our_pid(data_dir: Path) -> int | None:
    try:
        pid = int(_pid_path(data_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    if alive(pid) and _marker(data_dir) in cmdline(pid):
        return pid
    return None


def _log_tail(data_dir: Path) -> str:
    try:
        return tail((data_dir / "registry.log").read_text(errors="replace"))
    except OSError:
        return "(no log)"


def _wait_until_answers(url: str, deadline: float, proc: subprocess.Popen[bytes] | None,
                        data_dir: Path) -> None:
    while not registry_answers(url):
        if proc is not None and proc.poll() is not None:
            raise RegistryServerError(
                f"the schema registry for {url} exited with code {proc.returncode} while"
                f" starting; last lines of {data_dir / 'registry.log'}:\n{_log_tail(data_dir)}")
        if time.monotonic() >= deadline:
            raise RegistryServerError(
                f"the schema registry for {url} did not answer in time; last lines of"
                f" {data_dir / 'registry.log'}:\n{_log_tail(data_dir)}")
        time.sleep(0.2)


def ensure_registry(port: int = DEFAULT_REGISTRY_PORT, data_dir: Path | None = None,
                    version: str = APICURIO_VERSION, timeout: float = 120.0) -> LocalRegistry:
    """Start a registry on 127.0.0.1:`port` unless ours already runs there; return once it
    answers (the first call also builds it: see `build_registry`)."""
    data_dir = (data_dir or default_registry_dir(port)).resolve()
    url = registry_url(port)
    pid = _our_pid(data_dir)
    if pid is not None:
        _wait_until_answers(url, time.monotonic() + timeout, None, data_dir)
        return LocalRegistry(port, data_dir, pid, already_running=True)
    if port_in_use(port):
        raise RegistryServerError(
            f"port {port} on {HOST} is already in use by another process (not a registry"
            f" started from {data_dir}); pick another with --port")
    java = find_java(MIN_JAVA, "the schema registry", RegistryServerError)
    runner = build_registry(version)
    data_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    pid = start_detached(
        [java, *JVM_OPTS, _marker(data_dir),
         f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={port}",
         f"-Dvertx.cacheDirBase={data_dir / 'vertx'}", "-jar", str(runner)],
        data_dir, data_dir / "registry.log", _pid_path(data_dir),
        lambda proc: _wait_until_answers(url, deadline, proc, data_dir))
    return LocalRegistry(port, data_dir, pid)


def stop_registry(port: int = DEFAULT_REGISTRY_PORT, data_dir: Path | None = None,
                  timeout: float = 20.0) -> bool:
    """Stop the registry we started from `data_dir`; False if none was running."""
    data_dir = (data_dir or default_registry_dir(port)).resolve()
    pid = _our_pid(data_dir)
    if pid is not None:
        terminate(pid, timeout)
        if alive(pid):
            raise RegistryServerError(f"the schema registry (pid {pid}) did not exit even"
                                      " after SIGKILL")
    _pid_path(data_dir).unlink(missing_ok=True)
    return pid is not None


def registry_status(port: int = DEFAULT_REGISTRY_PORT,
                    data_dir: Path | None = None) -> tuple[bool, int | None]:
    """Whether a registry answers on `port`, and the pid of ours if it is alive."""
    data_dir = (data_dir or default_registry_dir(port)).resolve()
    return registry_answers(registry_url(port)), _our_pid(data_dir)
