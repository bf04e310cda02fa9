"""A single-node KRaft Kafka broker (combined broker + controller) run from Maven Central jars.

No Docker and no tarball: the jars are fetched once per Kafka version with Maven into the user
cache dir, the data dir is formatted with `kafka.tools.StorageTool`, and `kafka.Kafka` runs
detached in its own session so it outlives the command that started it. Everything a broker
owns (server.properties, cluster id, pid file, log, the log.dirs) lives in its data dir.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from sluicegate.ops.localkafka.processes import (
    HOST,
    alive,
    cmdline,
    find_java,
    find_maven,
    port_in_use,
    reap,
    start_detached,
    tail,
    terminate,
)

DEFAULT_KAFKA_VERSION = "4.4.0"
DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
MIN_JAVA = 17  # kafka_2.13 4.x is compiled for Java 17 (minNonClientJavaVersion)

CA_FILE = "ca.pem"  # in <data-dir>/tls: the CA that signed the TLS listener's certificate

_PACKAGE = "sluicegate.ops.localkafka"

# Heap small enough for a 2-core CI box next to the tests; G1 flags as in kafka-run-class.sh.
JVM_OPTS = (
    "-Xms256m",
    "-Xmx768m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
TOOL_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-Dsluicegate.log.level=WARN")

# librdkafka logs every refused connection at ERROR level; while we poll a broker that is still
# starting those lines are expected noise, so the probing client logs nowhere.
_SILENT = logging.getLogger("sluicegate.localkafka.probe")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


class BrokerError(RuntimeError):
    """Anything that stops the local broker from starting, answering or stopping."""


@dataclass(frozen=True, slots=True)
class SaslPlain:
    """An extra SASL_PLAINTEXT listener with one PLAIN user, for testing client auth."""

    username: str
    password: str
    port: int

    @classmethod
    def parse(cls, user_pass: str, port: int) -> SaslPlain:
        username, sep, password = user_pass.partition(":")
        if not sep or not username or not password:
            raise BrokerError(f"--sasl-plain wants USER:PASS, got {user_pass!r}")
        if '"' in user_pass or "\\" in user_pass:
            raise BrokerError("--sasl-plain: quotes and backslashes are not supported")
        return cls(username, password, port)


@dataclass(frozen=True, slots=True)
class Tls:
    """An extra SSL listener whose certificate a CA of the data dir's own signed."""

    port: int


@dataclass(frozen=True, slots=True)
class TlsFiles:
    ca: Path  # PEM: what clients set as `ssl.ca.location`
    keystore: Path  # PKCS12: the broker's key and certificate chain
    password: str


@dataclass(frozen=True, slots=True)
class LocalBroker:
    port: int
    controller_port: int
    data_dir: Path
    pid: int
    kafka_version: str
    already_running: bool = False
    sasl_port: int | None = None
    tls_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def sasl_bootstrap(self) -> str | None:
        return None if self.sasl_port is None else f"{HOST}:{self.sasl_port}"

    @property
    def tls_bootstrap(self) -> str | None:
        return None if self.tls_port is None else f"{HOST}:{self.tls_port}"

    @property
    def ca_path(self) -> Path | None:
        return None if self.tls_port is None else tls_dir(self.data_dir) / CA_FILE

    @property
    def log_path(self) -> Path:
        return log_path(self.data_dir)


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    bootstrap: str
    answers: bool
    pid: int | None  # set when a broker we started from this data dir is alive


# ---------------------------------------------------------------------------------------------
# Paths


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    # Keyed by port so brokers on different ports never share (and corrupt) one log.dirs.
    return Path(platformdirs.user_data_dir("sluicegate")) / f"kafka-{port}"


def jar_cache_dir(kafka_version: str) -> Path:
    return Path(platformdirs.user_cache_dir("sluicegate")) / f"kafka-{kafka_version}"


def log_path(data_dir: Path) -> Path:
    return data_dir / "broker.log"


def tls_dir(data_dir: Path) -> Path:
    return data_dir / "tls"


def _pid_path(data_dir: Path) -> Path:
    return data_dir / "broker.pid"


def _props_path(data_dir: Path) -> Path:
    return data_dir / "server.properties"


# ---------------------------------------------------------------------------------------------
# Probes


def broker_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """True if a Kafka broker at `bootstrap` returns cluster metadata within `timeout` s."""
    host, _, port = bootstrap.rpartition(":")
    # A plain TCP connect first: cheap, and it spares creating a client when nothing listens.
    try:
        with socket.create_connection((host, int(port)), timeout=min(timeout, 1.0)):
            pass
    except OSError:
        return False
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.connection.setup.timeout.ms": max(1000, int(timeout * 1000)),
        },
        logger=_SILENT,
    )
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(metadata.brokers)


def _our_pid(data_dir: Path) -> int | None:
    """The pid of the broker started from `data_dir`, if that process is alive."""
    try:
        pid = int(_pid_path(data_dir).read_text().strip())
    except (OSError, ValueError):
        return None
    reap(pid)
    # A pid file can outlive its process and the pid can be reused: trust it only if that
    # process is a kafka.Kafka running this data dir's server.properties.
    cmd = cmdline(pid)
    if "kafka.Kafka" in cmd and str(_props_path(data_dir)) in cmd:
        return pid
    return None


def broker_status(port: int = DEFAULT_PORT, data_dir: Path | None = None) -> BrokerStatus:
    data_dir = (data_dir or default_data_dir(port)).resolve()
    bootstrap = f"{HOST}:{port}"
    return BrokerStatus(bootstrap, broker_answers(bootstrap), _our_pid(data_dir))


# ---------------------------------------------------------------------------------------------
# Prerequisites


def fetch_jars(kafka_version: str = DEFAULT_KAFKA_VERSION) -> Path:
    """The directory of the broker's jars; runs Maven only the first time per Kafka version."""
    cache = jar_cache_dir(kafka_version)
    lib = cache / "lib"
    if (cache / ".complete").exists():
        return lib
    mvn = find_maven(f"fetch the Kafka {kafka_version} jars into {cache}", BrokerError)
    cache.mkdir(parents=True, exist_ok=True)
    pom = resources.files(_PACKAGE).joinpath("pom.xml").read_text()
    pom = re.sub(r"(<kafka.version>)[^<]*(</kafka.version>)", rf"\g<1>{kafka_version}\2", pom)
    (cache / "pom.xml").write_text(pom)
    # Copy into a private dir and rename at the end, so an interrupted or concurrent fetch never
    # leaves a half-filled lib/ that looks complete.
    staging = cache / f"lib.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        mvn, "-q", "-B", "-f", str(cache / "pom.xml"), "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise BrokerError(
            f"Maven could not fetch Kafka {kafka_version} (exit {result.returncode}):\n"
            + tail(result.stdout + result.stderr)
        )
    if not any(staging.glob(f"kafka_2.13-{kafka_version}.jar")):
        raise BrokerError(f"Maven ran but kafka_2.13-{kafka_version}.jar is not in {staging}")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    (cache / ".complete").write_text(kafka_version + "\n")
    return lib


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed (exit {result.returncode}):\n"
                          + tail(result.stdout + result.stderr))


def tls_files(data_dir: Path) -> TlsFiles:
    """The data dir's CA and broker keystore, generated with openssl on first use.

    Kept across starts, so a client that already trusts `ca.pem` keeps working after a
    restart; delete `<data-dir>/tls` to get new ones.
    """
    folder = tls_dir(data_dir)
    ca_file, keystore, password_file = (folder / n for n in
                                        (CA_FILE, "broker.p12", "keystore.password"))
    if ca_file.exists() and keystore.exists() and password_file.exists():
        return TlsFiles(ca_file, keystore, password_file.read_text().strip())
    if shutil.which("openssl") is None:
        raise BrokerError("`openssl` not found on PATH: it generates the TLS listener's CA")
    # Generated in a private dir and renamed at the end, so an interrupted run never leaves
    # a CA that does not match the keystore.
    staging = folder.with_name(f"tls.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    password = secrets.token_hex(16)
    ca_key, ca, key, csr, cert = (staging / n for n in
                                  ("ca.key", CA_FILE, "broker.key", "broker.csr", "broker.pem"))
    days = "3650"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", days,
             "-subj", "/CN=sluicegate local Kafka CA", "-keyout", str(ca_key), "-out", str(ca))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={HOST}",
             "-keyout", str(key), "-out", str(csr))
    # librdkafka checks the broker's name against the certificate by default
    # (ssl.endpoint.identification.algorithm=https): the listener's address must be in it.
    ext = staging / "san.ext"
    ext.write_text(f"subjectAltName=IP:{HOST},DNS:localhost\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", days, "-extfile", str(ext), "-out", str(cert))
    _openssl("pkcs12", "-export", "-in", str(cert), "-inkey", str(key), "-certfile", str(ca),
             "-name", "broker", "-out", str(staging / keystore.name),
             "-passout", f"pass:{password}")
    (staging / password_file.name).write_text(password + "\n")
    for leftover in (ca_key, key, csr, cert, ext):
        leftover.unlink(missing_ok=True)  # only the CA's certificate and the keystore are needed
    (staging / "ca.srl").unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return TlsFiles(ca_file, keystore, password)


# ---------------------------------------------------------------------------------------------
# Configuration


def server_properties(
    port: int,
    controller_port: int,
    data_dir: Path,
    sasl: SaslPlain | None = None,
    tls: Tls | None = None,
) -> str:
    listeners = [f"PLAINTEXT://{HOST}:{port}", f"CONTROLLER://{HOST}:{controller_port}"]
    advertised = [f"PLAINTEXT://{HOST}:{port}"]
    protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
    extra: list[str] = []
    if sasl is not None:
        # Further listeners (TLS below, SCRAM) slot in the same way: one name, one protocol, and
        # listener.name.<name>.* settings; clients between brokers stay on PLAINTEXT.
        listeners.append(f"SASL_PLAINTEXT://{HOST}:{sasl.port}")
        advertised.append(f"SASL_PLAINTEXT://{HOST}:{sasl.port}")
        protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
        jaas = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{sasl.username}" password="{sasl.password}" '
            f'user_{sasl.username}="{sasl.password}";'
        )
        extra += [
            "sasl.enabled.mechanisms=PLAIN",
            "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
        ]
    if tls is not None:
        files = tls_files(data_dir)
        listeners.append(f"SSL://{HOST}:{tls.port}")
        advertised.append(f"SSL://{HOST}:{tls.port}")
        protocols.append("SSL:SSL")
        extra += [
            "listener.name.ssl.ssl.keystore.type=PKCS12",
            f"listener.name.ssl.ssl.keystore.location={files.keystore}",
            f"listener.name.ssl.ssl.keystore.password={files.password}",
            f"listener.name.ssl.ssl.key.password={files.password}",
        ]
    lines = [
        "# Written by `sluicegate kafka up` on every start; edits here are overwritten.",
        "process.roles=broker,controller",
        "node.id=1",
        # Static voters, so the data dir is formatted without --standalone.
        f"controller.quorum.voters=1@{HOST}:{controller_port}",
        f"listeners={','.join(listeners)}",
        f"advertised.listeners={','.join(advertised)}",
        f"listener.security.protocol.map={','.join(protocols)}",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        f"log.dirs={data_dir / 'logs'}",
        # One broker: every internal topic at replication 1 / min.isr 1, or group joins and
        # initTransactions hang waiting for replicas that cannot exist.
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=1",
        # Share groups (engines on a share group) need nothing else on 4.4.0: the format
        # gives a new cluster share.version=2 (docs/decisions/local-broker.md).
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "min.insync.replicas=1",
        "default.replication.factor=1",
        "num.partitions=1",
        # sluicegate declares its own topics; a typo'd topic name should fail, not appear.
        "auto.create.topics.enable=false",
        # The default 3 s delay would be added to every test's first consumer-group join.
        "group.initial.rebalance.delay.ms=0",
        # Small footprint: 2 cores, a 768 MiB heap.
        "num.network.threads=2",
        "num.io.threads=2",
        "num.recovery.threads.per.data.dir=1",
        "log.cleaner.dedupe.buffer.size=2097152",
        "log.cleaner.threads=1",
        # Dev-box disk use: 16 MiB segments (the minimum is 1 MiB), delete after 24 h or
        # 256 MiB per partition, whichever first.
        "log.segment.bytes=16777216",
        "log.retention.hours=24",
        "log.retention.bytes=268435456",
        "log.retention.check.interval.ms=60000",
        "log.delete.delay.ms=1000",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def _cluster_id(data_dir: Path) -> str:
    # Kept in the data dir so a re-format (--ignore-formatted) always sees the same id.
    path = data_dir / "cluster-id"
    if path.exists():
        return path.read_text().strip()
    # Kafka's own Uuid.randomUuid() never starts an id with "-": the tools' argument parser
    # would take it for an option.
    cid = "-"
    while cid.startswith("-"):
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    path.write_text(cid + "\n")
    return cid


def _java_cmd(java: str, lib: Path, data_dir: Path, opts: Sequence[str]) -> list[str]:
    return [
        java,
        *opts,
        f"-Dlog4j2.configurationFile={data_dir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={data_dir / 'logs'}",
        "-cp",
        f"{lib}{os.sep}*",  # the JVM expands the wildcard; no shell involved
    ]


def _log_tail(data_dir: Path) -> str:
    try:
        return tail(log_path(data_dir).read_text(errors="replace"))
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------------
# Start / stop


def _wait_until_answers(
    bootstrap: str, deadline: float, proc: subprocess.Popen[bytes] | None, data_dir: Path
) -> None:
    while True:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(
                f"the Kafka broker for {bootstrap} exited with code {proc.returncode} while "
                f"starting; last lines of {log_path(data_dir)}:\n{_log_tail(data_dir)}"
            )
        if broker_answers(bootstrap, timeout=1.0):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(
                f"the Kafka broker for {bootstrap} did not answer in time; last lines of "
                f"{log_path(data_dir)}:\n{_log_tail(data_dir)}"
            )
        time.sleep(0.2)


def ensure_broker(
    port: int = DEFAULT_PORT,
    controller_port: int = DEFAULT_CONTROLLER_PORT,
    data_dir: Path | None = None,
    kafka_version: str = DEFAULT_KAFKA_VERSION,
    timeout: float = 90.0,
    sasl: SaslPlain | None = None,
    tls: Tls | None = None,
) -> LocalBroker:
    """Start a broker on 127.0.0.1:`port` unless ours already runs there; return once it answers.

    If one we started from `data_dir` is already alive it is left as it is (even if it was
    started with other options) and returned with `already_running=True`.
    """
    data_dir = (data_dir or default_data_dir(port)).resolve()
    bootstrap = f"{HOST}:{port}"
    deadline = time.monotonic() + timeout
    ports = [port, controller_port] + [x.port for x in (sasl, tls) if x is not None]
    if len(set(ports)) != len(ports):
        raise BrokerError(f"the broker's ports must differ, got {ports}")

    pid = _our_pid(data_dir)
    if pid is not None:
        # Possibly still starting (a concurrent `up`): wait for it rather than start another.
        _wait_until_answers(bootstrap, deadline, None, data_dir)
        return LocalBroker(port, controller_port, data_dir, pid, kafka_version, True,
                           sasl.port if sasl else None, tls.port if tls else None)

    for p in ports:
        if port_in_use(p):
            raise BrokerError(
                f"port {p} on {HOST} is already in use by another process "
                f"(not a broker started from {data_dir}); pick another with --port / "
                "--controller-port, or stop whatever holds it"
            )

    java = find_java(MIN_JAVA, "the Kafka broker", BrokerError)
    lib = fetch_jars(kafka_version)

    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "log4j2.properties").write_text(
        resources.files(_PACKAGE).joinpath("log4j2.properties").read_text()
    )
    props = _props_path(data_dir)
    props.write_text(server_properties(port, controller_port, data_dir, sasl, tls))

    fmt = [
        *_java_cmd(java, lib, data_dir, TOOL_JVM_OPTS),
        "kafka.tools.StorageTool", "format",
        "-t", _cluster_id(data_dir), "-c", str(props), "--ignore-formatted",
    ]  # fmt: skip
    result = subprocess.run(fmt, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise BrokerError(
            f"formatting {data_dir / 'logs'} failed (exit {result.returncode}):\n"
            + tail(result.stdout + result.stderr)
        )

    pid = start_detached(
        [*_java_cmd(java, lib, data_dir, JVM_OPTS), "kafka.Kafka", str(props)], data_dir,
        log_path(data_dir), _pid_path(data_dir),
        lambda proc: _wait_until_answers(bootstrap, deadline, proc, data_dir))
    return LocalBroker(port, controller_port, data_dir, pid, kafka_version, False,
                       sasl.port if sasl else None, tls.port if tls else None)


def stop_broker(
    port: int = DEFAULT_PORT, data_dir: Path | None = None, timeout: float = 30.0
) -> bool:
    """Stop the broker we started from `data_dir`; False if none was running (idempotent).

    SIGTERM first, SIGKILL if it has not exited after `timeout` seconds.
    """
    data_dir = (data_dir or default_data_dir(port)).resolve()
    pid = _our_pid(data_dir)
    if pid is None:
        _pid_path(data_dir).unlink(missing_ok=True)
        return False
    terminate(pid, timeout)
    if alive(pid):
        raise BrokerError(f"the Kafka broker (pid {pid}) did not exit even after SIGKILL")
    _pid_path(data_dir).unlink(missing_ok=True)
    return True
