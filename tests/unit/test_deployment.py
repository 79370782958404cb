"""Deployment files: docker-compose*.yml through a real Compose parser, Dockerfile, .env.example, README.

No container engine runs here. The compose files are validated and resolved by the Compose CLI's ``config``
(the Docker CLI plugin ``docker compose`` when present, else a standalone ``docker-compose``: Debian's package
is enough; it validates against the compose-spec schema and interpolates ``${VAR:?message}``). Without one
these tests skip, except under CI (``CI`` set), where they fail: CI must install it.

Each service's command is resolved against the package (uvicorn factory, Celery app and queues, alembic.ini,
console scripts); every setting the code reads is in ``.env.example`` and every entry there is read.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = "docker-compose.yml"
COMPOSE_CPU = "docker-compose.cpu.yml"
COMPOSE_WORKER = "docker-compose.worker.yml"
COMPOSE_FILES = (COMPOSE, COMPOSE_CPU, COMPOSE_WORKER)
# The podman overrides and CI's (compose/): parsed with the files they override.
COMPOSE_PODMAN = "compose/podman.yml"
COMPOSE_PODMAN_CPU = "compose/podman-cpu.yml"
COMPOSE_CI = "compose/ci.yml"
OVERRIDES = (COMPOSE_PODMAN, COMPOSE_PODMAN_CPU, COMPOSE_CI)
SUITE_WORKERS = ("worker-gpu", "worker-cpu")
# Settings the images set themselves (Dockerfile ENV) or compose sets per service: not handed over by name (a
# name without a value would unset the image's own).
SET_BY_IMAGE_OR_COMPOSE = frozenset(
    {
        "SPECWATCH_ENV",
        "SPECWATCH_DATABASE_URL",
        "SPECWATCH_REDIS_URL",
        "SPECWATCH_WEBHOOK_SECRET",
        "SPECWATCH_ALLOW_LOCAL_REPOSITORIES",
        "SPECWATCH_ALLOW_PRIVATE_HOSTS",
        "SPECWATCH_WORKER_MIRROR_DIR",
        "SPECWATCH_WORKER_RELEASE_CACHE_DIR",
        "SPECWATCH_WORKER_SANDBOX",
    }
)
# Only the housekeeping worker delivers notifications: the channels' secrets go nowhere else.
NOTIFY_SECRETS = ("SPECWATCH_SLACK_WEBHOOK_URL", "SPECWATCH_GITHUB_TOKEN")
SPECWATCH_SERVICES = ("migrate", "api", "worker-gpu", "worker", "beat")
# Variables docker compose itself reads from .env (not interpolated in our files, not settings).
COMPOSE_CLI_VARIABLES = frozenset({"COMPOSE_FILE", "COMPOSE_PROFILES", "COMPOSE_PROJECT_NAME"})
# SPECWATCH_* variables the code reads directly rather than through a Settings class, and why .env.example
# does not list them.
DIRECT_READS_NOT_IN_ENV_EXAMPLE = {
    # The suite's cache of installed releases (specwatch/targets/install.py), read inside the suite
    # subprocess, whose environment never carries SPECWATCH_* variables from .env: a worker sets it from
    # SPECWATCH_WORKER_RELEASE_CACHE_DIR.
    "SPECWATCH_CACHE_DIR",
}
ASSIGNMENT = re.compile(r"^(?P<commented>#\s?)?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)")


# ------------------------------------------------------------------------------------------ helpers
@functools.cache
def compose_cli() -> tuple[str, ...] | None:
    """``docker compose`` when the plugin answers, else a standalone ``docker-compose``, else None."""
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False, timeout=60)
        if probe.returncode == 0:
            return (docker, "compose")
    standalone = shutil.which("docker-compose")
    return (standalone,) if standalone is not None else None


@pytest.fixture(scope="module")
def compose() -> tuple[str, ...]:
    cli = compose_cli()
    if cli is None:
        message = "no Compose CLI: install Debian's docker-compose (apt-get install -y docker-compose) or the docker compose plugin"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return cli


def env_example() -> dict[str, tuple[bool, str]]:
    """``.env.example`` as {name: (commented out, value)}; a commented-out assignment documents a default."""
    entries: dict[str, tuple[bool, str]] = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = ASSIGNMENT.match(line)
        if match:
            name = match["name"]
            assert name not in entries, f".env.example lists {name} twice"
            entries[name] = (match["commented"] is not None, match["value"])
    return entries


REQUIRED_SECRETS = {"POSTGRES_PASSWORD": "pg-secret", "SPECWATCH_WEBHOOK_SECRET": "hook-secret", "REDIS_PASSWORD": "redis-secret"}


def project(tmp_path: Path, values: dict[str, str]) -> Path:
    """A copy of the compose files with a ``.env`` made from ``.env.example`` and ``values`` filled in."""
    for name in (*COMPOSE_FILES, *OVERRIDES):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    lines = []
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = ASSIGNMENT.match(line)
        lines.append(f"{match['name']}={values[match['name']]}" if match and match["name"] in values else line)
    lines += [f"{name}={value}" for name, value in values.items() if name not in env_example()]
    (tmp_path / ".env").write_text("\n".join(lines) + "\n")
    return tmp_path


def run_config(cli: tuple[str, ...], directory: Path, *files: str, profiles: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    # Only what the CLI needs from our environment: nothing of the developer's or CI's settings leaks in.
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG") if name in os.environ}
    args = [*cli]
    for name in files or (COMPOSE,):
        args += ["-f", name]
    for profile in profiles:
        args += ["--profile", profile]
    args.append("config")
    return subprocess.run(args, cwd=directory, env=env, capture_output=True, text=True, check=False, timeout=120)


def resolved(cli: tuple[str, ...], directory: Path, *files: str, profiles: tuple[str, ...] = ()) -> dict[str, Any]:
    done = run_config(cli, directory, *files, profiles=profiles)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert isinstance(config, dict)
    return config


@pytest.fixture(scope="module")
def main_config(compose: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return resolved(compose, project(tmp_path_factory.mktemp("compose"), REQUIRED_SECRETS))


def published_ports(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host ip, published port) of each port, in either CLI's output form (short string or long mapping)."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((str(port.get("host_ip", "")), str(port.get("published", ""))))
        else:
            host_ip, published, _ = str(port).rsplit(":", 2) if str(port).count(":") >= 2 else ("", *str(port).split(":", 1))
            out.append((host_ip, published))
    return out


def volume_sources(service: dict[str, Any]) -> set[str]:
    return {str(v["source"] if isinstance(v, dict) else v.split(":", 1)[0]) for v in service.get("volumes", [])}


def option(command: list[str], name: str) -> str:
    assert name in command, f"{name} not in {command}"
    return command[command.index(name) + 1]


# ------------------------------------------------------------------------------- compose: the parser
def test_compose_file_is_valid_and_has_the_production_shape(main_config: dict[str, Any]) -> None:
    services = main_config["services"]
    assert set(services) == {"postgres", "redis", "proxy", *SPECWATCH_SERVICES}
    assert {"postgres-data", "mirrors"} <= set(main_config["volumes"])
    assert "postgres-data" in volume_sources(services["postgres"])
    for name in ("postgres", "redis", "api"):
        assert services[name]["healthcheck"]["test"], f"{name} has no healthcheck"
    assert services["migrate"]["command"] == ["specwatch", "db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in SPECWATCH_SERVICES[1:]:
        depends = {dep: spec["condition"] for dep, spec in services[name]["depends_on"].items()}
        assert depends == {
            "postgres": "service_healthy",
            "redis": "service_healthy",
            "migrate": "service_completed_successfully",
        }, name


def test_specwatch_services_run_in_production_with_the_compose_services(main_config: dict[str, Any]) -> None:
    services = main_config["services"]
    for name in SPECWATCH_SERVICES:
        env = services[name]["environment"]
        assert env["SPECWATCH_ENV"] == "prod", name
        assert env["SPECWATCH_DATABASE_URL"] == "postgresql+psycopg://specwatch:pg-secret@postgres:5432/specwatch", name
        assert env["SPECWATCH_REDIS_URL"].startswith("redis://:redis-secret@redis:6379/"), name
        assert env["SPECWATCH_ALLOW_LOCAL_REPOSITORIES"] == env["SPECWATCH_ALLOW_PRIVATE_HOSTS"] == "false", name
        assert env["SPECWATCH_WEBHOOK_SECRET"] == "hook-secret", name
    assert services["worker-gpu"]["environment"]["SPECWATCH_WORKER_SANDBOX"] == "bwrap"
    assert services["redis"]["command"][-2:] == ["--requirepass", "redis-secret"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pg-secret"


def test_ports_are_bound_to_loopback(main_config: dict[str, Any]) -> None:
    published = {name: published_ports(service) for name, service in main_config["services"].items() if service.get("ports")}
    assert set(published) == {"proxy"}, "the API is reached through the proxy only"
    assert published["proxy"] == [("127.0.0.1", "8000")]


def test_the_proxy_serves_the_shipped_configuration_in_front_of_the_api(main_config: dict[str, Any]) -> None:
    """nginx (compose/nginx/specwatch.conf, tested in tests/security/test_proxy_slow_clients.py) as the official
    image's only server, started once the API is healthy (nginx resolves ``api`` when it starts)."""
    proxy = main_config["services"]["proxy"]
    assert proxy["image"].startswith("nginx:")
    (volume,) = proxy["volumes"]
    source = volume["source"] if isinstance(volume, dict) else volume.split(":", 1)[0]
    target = volume["target"] if isinstance(volume, dict) else volume.split(":")[1]
    assert Path(source).parts[-3:] == ("compose", "nginx", "specwatch.conf")
    assert target == "/etc/nginx/conf.d/default.conf"
    assert proxy["depends_on"]["api"]["condition"] == "service_healthy"
    assert "server api:8000;" in (ROOT / "compose" / "nginx" / "specwatch.conf").read_text()
    (port,) = proxy["ports"]
    assert (port["target"] if isinstance(port, dict) else int(str(port).rsplit(":", 1)[1].removesuffix("/tcp"))) == 80


def test_gpu_worker_reserves_an_nvidia_gpu_and_runs_one_suite_at_a_time(main_config: dict[str, Any]) -> None:
    worker = main_config["services"]["worker-gpu"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert option(worker["command"], "-Q") == "gpu"
    assert option(worker["command"], "--concurrency") == "1"
    assert option(main_config["services"]["worker"]["command"], "-Q") == "default"
    assert "mirrors" in volume_sources(worker)
    assert "mirrors" in volume_sources(main_config["services"]["worker"]), "the pollers fetch into the mirrors"


@pytest.mark.parametrize("missing", sorted(REQUIRED_SECRETS))
def test_required_secrets_are_refused_when_missing(compose: tuple[str, ...], tmp_path: Path, missing: str) -> None:
    values = {name: value for name, value in REQUIRED_SECRETS.items() if name != missing}
    done = run_config(compose, project(tmp_path, values))
    assert done.returncode != 0
    assert missing in done.stderr


def test_cpu_override_replaces_the_gpu_worker_by_a_cpu_one(compose: tuple[str, ...], tmp_path: Path) -> None:
    directory = project(tmp_path, REQUIRED_SECRETS)
    services = resolved(compose, directory, COMPOSE, COMPOSE_CPU)["services"]
    # worker-gpu is not started without --profile gpu: Compose v2 leaves it out, v1 shows its profile.
    assert services.get("worker-gpu", {"profiles": ["gpu"]})["profiles"] == ["gpu"]
    gpu, cpu = resolved(compose, directory, COMPOSE, COMPOSE_CPU, profiles=("gpu",))["services"]["worker-gpu"], services["worker-cpu"]
    assert not cpu.get("profiles")
    assert "deploy" not in cpu
    assert cpu["environment"] == {**gpu["environment"], "SPECWATCH_WORKER_DEVICE": "cpu"}
    assert cpu["command"] == [arg.replace("gpu@%h", "cpu@%h") for arg in gpu["command"]]
    for key in ("env_file", "volumes", "depends_on", "init", "restart", "stop_grace_period", "security_opt"):
        assert cpu.get(key) == gpu.get(key), key
    # One CPU worker image, built once (by the housekeeping worker) and run by the other two.
    assert services["worker"]["build"]["args"]["TORCH_VARIANT"] == "cpu"
    for name in ("worker-cpu", "worker", "beat"):
        assert services[name]["image"] == "specwatch-worker:cpu", name


def test_remote_worker_file_is_the_gpu_worker_against_central_services(
    compose: tuple[str, ...], tmp_path: Path, main_config: dict[str, Any]
) -> None:
    central = {
        "SPECWATCH_WEBHOOK_SECRET": "hook-secret",
        "SPECWATCH_DATABASE_URL": "postgresql+psycopg://specwatch:pw@central:5432/specwatch",
        "SPECWATCH_REDIS_URL": "redis://:pw@central:6379/0",
    }
    config = resolved(compose, project(tmp_path, central), COMPOSE_WORKER)
    assert set(config["services"]) == {"worker-gpu"}
    remote, local = config["services"]["worker-gpu"], main_config["services"]["worker-gpu"]
    assert {name: value for name, value in remote["environment"].items() if value is not None} == {
        "SPECWATCH_ENV": "prod",
        "SPECWATCH_ALLOW_LOCAL_REPOSITORIES": "false",
        "SPECWATCH_ALLOW_PRIVATE_HOSTS": "false",
        "SPECWATCH_WORKER_SANDBOX": "bwrap",
        **central,
    }
    # The same settings handed by name (read from the files: a CLI may leave out a name that nothing sets).
    assert set(raw_environment(COMPOSE_WORKER, "worker-gpu")) == set(raw_environment(COMPOSE, "worker-gpu"))
    for key in ("command", "image", "deploy", "volumes", "init", "restart", "stop_grace_period", "security_opt", "env_file"):
        assert remote.get(key) == local.get(key), key
    # Built as the deployment's worker image is (there by the housekeeping worker).
    builder = main_config["services"]["worker"]
    assert remote["build"]["target"] == builder["build"]["target"]
    assert remote["build"]["args"] == builder["build"]["args"]


def test_no_container_gets_the_whole_env_file(compose: tuple[str, ...], tmp_path: Path) -> None:
    """Each service gets its connection settings and, by name, what it reads: the database and Redis passwords
    only inside the URLs of the services that connect, the notification channels' secrets only where the outbox
    is delivered, never in a suite worker."""
    directory = project(tmp_path, {**REQUIRED_SECRETS, "SPECWATCH_SLACK_WEBHOOK_URL": "https://hooks.example/T/B/x"})
    for files in ((COMPOSE,), (COMPOSE, COMPOSE_CPU)):
        services = resolved(compose, directory, *files)["services"]
        for name, service in services.items():
            assert "env_file" not in service, name
            env = service.get("environment") or {}
            assert "POSTGRES_PASSWORD" not in env or name == "postgres", name
            assert "REDIS_PASSWORD" not in env, name
            for secret in NOTIFY_SECRETS:
                assert secret not in env or name == "worker", f"{secret} in {name}"
        assert services["worker"]["environment"]["SPECWATCH_SLACK_WEBHOOK_URL"] == "https://hooks.example/T/B/x"
        assert services["migrate"]["environment"].keys() == {"SPECWATCH_ENV", *SET_BY_IMAGE_OR_COMPOSE} - {
            "SPECWATCH_WORKER_MIRROR_DIR",
            "SPECWATCH_WORKER_RELEASE_CACHE_DIR",
            "SPECWATCH_WORKER_SANDBOX",
        }


def raw_environment(file: str, service: str) -> dict[str, Any]:
    """A service's environment as its file writes it (YAML anchors and merges resolved, nothing interpolated)."""
    environment = yaml.safe_load((ROOT / file).read_text())["services"][service].get("environment") or {}
    assert isinstance(environment, dict), f"{file}: {service}'s environment as a mapping"
    return environment


def test_every_setting_reaches_a_service_that_reads_it() -> None:
    """Every SPECWATCH_* entry of .env.example is handed to a specwatch service (by name), except those the
    images or compose set; the workers' to every worker, the API's to the API."""
    services = {name: raw_environment(COMPOSE, name) for name in SPECWATCH_SERVICES}
    services["worker-cpu"] = raw_environment(COMPOSE_CPU, "worker-cpu")
    handed = {name for environment in services.values() for name in environment}
    settings = {name for name in env_example() if name.startswith("SPECWATCH_")}
    assert settings - SET_BY_IMAGE_OR_COMPOSE - handed == set()
    worker_settings = {name for name in settings if name.startswith("SPECWATCH_WORKER_")} - SET_BY_IMAGE_OR_COMPOSE
    for name in ("worker", "beat", "worker-gpu", "worker-cpu"):
        assert worker_settings <= set(services[name]), name
    assert {"SPECWATCH_API_TOKEN_HASHES", "SPECWATCH_SESSION_SECRET"} <= set(services["api"])
    for name, environment in services.items():
        passed = {key for key, value in environment.items() if value is None}
        assert not passed & SET_BY_IMAGE_OR_COMPOSE, f"{name} would unset what its image sets"


def test_each_image_is_built_once(compose: tuple[str, ...], tmp_path: Path) -> None:
    """One service builds each image; the others run it by name (no parallel builds of the same image)."""
    directory = project(tmp_path, REQUIRED_SECRETS)
    for files, builders in (((COMPOSE,), {"specwatch-api": "api", "specwatch-worker:cuda": "worker"}),
                            ((COMPOSE, COMPOSE_CPU), {"specwatch-api": "api", "specwatch-worker:cpu": "worker"})):  # fmt: skip
        services = resolved(compose, directory, *files)["services"]
        built = {service["image"]: name for name, service in services.items() if "build" in service}
        assert built == builders, files
        for name, service in services.items():
            if not service.get("profiles"):  # (worker-gpu, not started with the CPU file)
                assert service["image"] in builders or not service["image"].startswith("specwatch"), name


def test_suite_workers_can_run_bubblewrap(compose: tuple[str, ...], tmp_path: Path) -> None:
    """Docker: no seccomp filter (user namespaces) and no masked /proc paths (bwrap mounts its own /proc);
    podman: the same plus unmask=ALL, which is how it lifts the masks (it ignores systempaths)."""
    directory = project(tmp_path, REQUIRED_SECRETS)
    docker = resolved(compose, directory, COMPOSE, COMPOSE_CPU, profiles=("gpu",))["services"]
    podman = resolved(compose, directory, COMPOSE, COMPOSE_CPU, COMPOSE_PODMAN, COMPOSE_PODMAN_CPU, profiles=("gpu",))["services"]
    for name in SUITE_WORKERS:
        assert set(docker[name]["security_opt"]) == {"seccomp=unconfined", "systempaths=unconfined"}, name
        assert set(podman[name]["security_opt"]) == {"seccomp=unconfined", "systempaths=unconfined", "unmask=ALL"}, name
        assert docker[name]["environment"]["SPECWATCH_WORKER_SANDBOX"] == "bwrap", name
    for name in set(docker) - set(SUITE_WORKERS):
        assert "security_opt" not in docker[name], name
        assert "security_opt" not in podman[name], name
    # Podman ignores deploy's GPU reservation: the CDI device.
    assert "nvidia.com/gpu=all" in str(podman["worker-gpu"]["devices"])


def test_ci_override_changes_only_what_ci_needs(compose: tuple[str, ...], tmp_path: Path) -> None:
    values = {"SPECWATCH_COMPOSE_REPOS": "/srv/repos", "SPECWATCH_COMPOSE_INDEX": "/srv/index", "TORCH_VARIANT": "cpu"}
    directory = project(tmp_path, {**REQUIRED_SECRETS, **values})
    files = (COMPOSE, COMPOSE_CPU, COMPOSE_PODMAN, COMPOSE_PODMAN_CPU)
    base, ci = resolved(compose, directory, *files)["services"], resolved(compose, directory, *files, COMPOSE_CI)["services"]
    assert set(ci) - set(base) == {"slack", "index"}
    assert published_ports(ci["slack"])[0][0] == "127.0.0.1"
    assert "ports" not in ci["index"]  # the stack's package index: on the compose network only
    assert "/srv/index" in volume_sources(ci["index"])
    # The suite worker's install step reaches that index (named into its sandbox); the release poller reads it.
    suite = ci["worker-cpu"]["environment"]
    assert suite["PIP_INDEX_URL"] == "http://index:8080/simple"
    assert {"PIP_INDEX_URL", "PIP_TRUSTED_HOST"} <= set(json.loads(suite["SPECWATCH_WORKER_ENV_PASSTHROUGH"]))
    assert ci["worker"]["environment"]["SPECWATCH_WORKER_PYPI_URL"] == "http://index:8080"
    for name, service in base.items():
        for key in ("command", "image", "depends_on", "security_opt", "healthcheck", "restart"):
            assert ci[name].get(key) == service.get(key), (name, key)
    assert ci["worker"]["environment"]["SPECWATCH_SLACK_WEBHOOK_URL"].startswith("http://slack:8080/")
    assert "/srv/repos" in volume_sources(ci["worker-cpu"])


# --------------------------------------------------------------------- compose: commands resolve to code
def raw_services() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for file in COMPOSE_FILES:
        for name, service in yaml.safe_load((ROOT / file).read_text())["services"].items():
            if "command" in service:
                yield file, name, service


def celery_app(module_name: str) -> Any:
    """What ``celery -A module_name`` loads: the module's ``app`` or ``celery`` attribute, or its one Celery app."""
    from celery import Celery

    module = importlib.import_module(module_name)
    for attribute in ("app", "celery"):
        if isinstance(getattr(module, attribute, None), Celery):
            return getattr(module, attribute)
    apps = [value for value in vars(module).values() if isinstance(value, Celery)]
    assert len(apps) == 1, f"{module_name} has no single Celery app"
    return apps[0]


def console_scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def resolve(reference: str) -> Any:
    module_name, _, attribute = reference.partition(":")
    return functools.reduce(getattr, attribute.split("."), importlib.import_module(module_name))


def check_command(command: list[str]) -> None:
    program = command[0]
    if program == "uvicorn":
        assert "--factory" in command
        factory = resolve(next(arg for arg in command[1:] if ":" in arg and not arg.startswith("-")))
        assert callable(factory)
        assert all(parameter.default is not inspect.Parameter.empty for parameter in inspect.signature(factory).parameters.values())
    elif program == "celery":
        app = celery_app(option(command, "-A"))
        if command[command.index("-A") + 2] == "worker":
            known = {queue.name for queue in app.conf.task_queues}
            assert set(option(command, "-Q").split(",")) <= known
        else:
            assert command[command.index("-A") + 2] == "beat"
            assert app.conf.beat_schedule
    elif program in console_scripts():
        assert callable(resolve(console_scripts()[program]))
        if program == "specwatch":  # the command and its subcommands exist in the whole command line
            from typer.main import get_command

            from service.cli import app

            group = get_command(app)
            for word in command[1:]:
                if word.startswith("-") or not hasattr(group, "commands"):
                    break
                assert word in group.commands, f"{word!r} is not a command of {command}"
                group = group.commands[word]
    else:
        pytest.fail(f"unknown program {program!r} in {command}")


@pytest.mark.parametrize(("file", "name", "service"), list(raw_services()), ids=lambda value: value if isinstance(value, str) else "")
def test_service_command_resolves_to_an_entry_point(file: str, name: str, service: dict[str, Any]) -> None:
    if "build" not in service and not str(service.get("image", "")).startswith("specwatch-"):
        return  # a third-party image (redis): its own command
    check_command(service["command"])


def test_every_routed_queue_has_a_worker(main_config: dict[str, Any]) -> None:
    app = celery_app("workers.celery_app")
    routed = {route["queue"] for route in app.conf.task_routes.values()} | {app.conf.task_default_queue}
    routed |= {entry["options"]["queue"] for entry in app.conf.beat_schedule.values() if "queue" in entry.get("options", {})}
    consumed = {
        queue
        for service in main_config["services"].values()
        if service.get("command", [None])[0] == "celery" and "worker" in service["command"]
        for queue in option(service["command"], "-Q").split(",")
    }
    assert routed <= consumed


def test_api_healthcheck_answers_on_the_app(tmp_path: Path, main_config: dict[str, Any]) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    probe = " ".join(main_config["services"]["api"]["healthcheck"]["test"])
    path = re.search(r"http://127\.0\.0\.1:8000(/[^'\"]*)", probe)
    assert path, probe
    settings = Settings(_env_file=None, env="test", database_url=f"sqlite:///{tmp_path / 'health.db'}")
    with TestClient(create_app(settings)) as client:
        assert client.get(path[1]).status_code == 200


def test_readme_commands_exist_in_the_cli() -> None:
    """Every ``specwatch ...`` command of the deployment page (docs/deployment.md) names a real command and real
    options."""
    from typer.main import get_command

    from service.cli import app

    section = (ROOT / "docs" / "deployment.md").read_text().replace("\\\n", " ")
    invocations = re.findall(r"(?:^|exec \S+ |`)specwatch ([^`\n]+)", section, re.MULTILINE)
    assert invocations
    root = get_command(app)
    for invocation in invocations:
        command = root
        words = invocation.split()
        # Groups by their subcommands (typer's group is not necessarily the installed click's class).
        while words and words[0] in getattr(command, "commands", {}):
            command = command.commands[words.pop(0)]
        assert not hasattr(command, "commands"), f"specwatch {invocation}: not a command"
        known = {name for parameter in command.params for name in getattr(parameter, "opts", [])}
        used = {word for word in words if word.startswith("--")}
        assert used <= known, f"specwatch {invocation}: unknown options {sorted(used - known)}"


# ------------------------------------------------------------------------------------------- Dockerfile
def dockerfile_stages() -> dict[str, list[str]]:
    """{stage name: its instructions, continuation lines joined}."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = stages.setdefault(match[1], [])
        current.append(line)
    return stages


def test_compose_builds_existing_dockerfile_targets(main_config: dict[str, Any]) -> None:
    stages = dockerfile_stages()
    targets = {service["build"]["target"] for service in main_config["services"].values() if "build" in service}
    assert targets == {"api", "worker"}
    assert targets <= set(stages)
    assert list(stages)[-1] == "api", "a plain `docker build .` gives the api image"


def test_the_worker_image_can_build_llamacpp_and_takes_a_cuda_toolkit(
    compose: tuple[str, ...], main_config: dict[str, Any], tmp_path: Path
) -> None:
    """The worker image has what the llama.cpp build needs (each of build.BUILD_COMMANDS from a package installed)
    and the sandbox it runs in (bubblewrap); CUDA_TOOLKIT reaches the worker image's build through compose (empty by
    default), and the Dockerfile's CUDA step, run as the build runs it, does nothing when it is empty and refuses
    anything but a version MAJOR-MINOR before it downloads anything."""
    from specwatch.targets.llamacpp.build import BUILD_COMMANDS

    stages = dockerfile_stages()
    packages = {word for line in stages["worker"] if "apt-get install" in line for word in line.split()}
    provides = {"cmake": "cmake", "g++": "g++", "c++": "g++", "ninja": "ninja-build", "make": "make", "clang++": "clang"}
    for what, commands in BUILD_COMMANDS.items():
        assert any(provides[c] in packages for c in commands), what
    assert {"bubblewrap", "git"} <= packages
    assert main_config["services"]["worker"]["build"]["args"]["CUDA_TOOLKIT"] == ""
    asked = resolved(compose, project(tmp_path, {**REQUIRED_SECRETS, "CUDA_TOOLKIT": "12-6"}))["services"]
    assert asked["worker"]["build"]["args"]["CUDA_TOOLKIT"] == "12-6"
    assert "ARG CUDA_TOOLKIT=" in stages["worker"]
    (step,) = [line.removeprefix("RUN ") for line in stages["worker"] if line.startswith("RUN ") and "CUDA_TOOLKIT" in line]
    path = f"{Path(sys.executable).parent}:{os.defpath}"  # `python`, as in the image
    for value, refused in (("", False), ("12.6", True), ("latest", True), ("12-6; true", True), ("12-6\n13-0", True)):
        env = {"PATH": path, "CUDA_TOOLKIT": value, "CUDA_REPOSITORY": "http://127.0.0.1:9"}  # nothing listens on port 9
        done = subprocess.run(["sh", "-c", step], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert (done.returncode, "must be empty or a CUDA version" in done.stderr) == ((1, True) if refused else (0, False)), value


def test_images_run_as_an_unprivileged_user() -> None:
    stages = dockerfile_stages()
    for name in ("api", "worker"):
        users = [line.split()[1] for line in stages[name] if line.startswith("USER ")]
        assert users, f"{name} runs as root"
        assert users[-1] not in ("root", "0"), name


#: What each Debian package the worker image may install provides of the llama.cpp build's commands.
DEBIAN_COMMANDS = {"cmake": ("cmake",), "g++": ("g++", "c++"), "clang": ("clang++",), "ninja-build": ("ninja",), "make": ("make",)}


def test_worker_image_can_build_llama_cpp() -> None:
    """The worker stage's apt-get installs a provider of every command the llama.cpp build needs (build.py's
    BUILD_COMMANDS: CMake, a C++ compiler, a build tool); the api image needs none of them."""
    from specwatch.targets.llamacpp.build import BUILD_COMMANDS

    def installed(stage: str) -> set[str]:
        lines = [line for line in dockerfile_stages()[stage] if "apt-get install" in line]
        words = [word for line in lines for word in line.split("apt-get install", 1)[1].split("&&", 1)[0].split()]
        packages = {word for word in words if not word.startswith("-")}
        return {command for package in packages for command in DEBIAN_COMMANDS.get(package, ())}

    provided = installed("worker")
    for what, commands in BUILD_COMMANDS.items():
        assert provided & set(commands), f"the worker image installs nothing that provides {what} ({commands})"
    assert not installed("api")


def test_dockerfile_copies_what_exists_and_is_not_ignored() -> None:
    ignored = [
        line.strip().lstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    for instructions in dockerfile_stages().values():
        for line in instructions:
            if line.startswith("COPY ") and "--from=" not in line:
                for source in line.split()[1:-1]:
                    assert (ROOT / source).exists(), source
                    assert source not in ignored, f"{source} is in .dockerignore"


def test_api_image_requirements_exclude_the_suite(tmp_path: Path) -> None:
    """Runs the Dockerfile's own requirement extraction (compose/pip/requirements.py): torch only in the worker's list."""
    assert "python /pip/requirements.py api" in (ROOT / "Dockerfile").read_text()
    shutil.copy(ROOT / "pyproject.toml", tmp_path)

    def requirements(image: str) -> set[str]:
        script = str(ROOT / "compose" / "pip" / "requirements.py")
        done = subprocess.run([sys.executable, script, image], cwd=tmp_path, capture_output=True, text=True, check=True)
        return {re.split(r"[<>=!~\[ ;]", line, maxsplit=1)[0] for line in done.stdout.split()}

    api, worker = requirements("api"), requirements("worker")
    assert {"fastapi", "celery", "alembic"} <= api
    assert not api & {"torch", "numpy", "scipy"}
    assert {"torch", "numpy", "scipy"} <= worker


def test_dockerfile_needs_no_registry_frontend_and_installs_the_wheel() -> None:
    """No `# syntax=` line (BuildKit would fetch that frontend from a registry: offline builds fail); both images
    install the project's wheel, never the source tree; pip's build arguments in every stage that downloads."""
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    stages = dockerfile_stages()
    assert any("pip wheel --no-deps" in line for line in stages["wheel"])
    for name in ("api", "worker"):  # last, in the final stages: a change of the code rebuilds one small layer
        assert re.search(r"pip install --no-deps /tmp/dist/specwatch-\S*\.whl", " ".join(stages[name])), name
    for name, instructions in stages.items():
        assert not any(re.match(r"RUN .*pip install .*\s\.(\s|$)", line) for line in instructions), f"{name} installs the tree"
        # Every stage that downloads (pip beyond a local wheel without dependencies) takes pip's build arguments.
        if any(("pip install" in line and "--no-deps" not in line) or "pip wheel" in line for line in instructions):
            args = {line.split()[1].split("=")[0] for line in instructions if line.startswith("ARG ")}
            assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_FIND_LINKS"} <= args, name


def test_dockerfile_pins_match_the_project() -> None:
    text = (ROOT / "Dockerfile").read_text()
    makefile_torch = re.search(r"TORCH_SPEC \?= torch==(\S+)", (ROOT / "Makefile").read_text())
    dev_transformers = next(
        r
        for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
        if r.startswith("transformers")
    )
    dev_gguf = next(
        r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"] if r.startswith("gguf")
    )
    assert makefile_torch
    assert f"ARG TORCH_VERSION={makefile_torch[1]}\n" in text
    assert f"ARG TRANSFORMERS_VERSION={dev_transformers.split('==')[1]}\n" in text
    assert f"ARG GGUF_VERSION={dev_gguf.split('==')[1]}\n" in text


# ---------------------------------------------------------------------------------------- .env.example
def settings_classes() -> list[type[BaseSettings]]:
    """Every BaseSettings subclass defined in service/ and workers/ (the suite reads no settings)."""
    found: dict[str, type[BaseSettings]] = {}
    for package_name in ("service", "workers"):
        package = importlib.import_module(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if info.name.startswith("specwatch"):
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if inspect.isclass(value) and issubclass(value, BaseSettings) and value.__module__ == info.name:
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    assert {"service.settings.Settings", "workers.settings.WorkerSettings"} <= set(found)
    return list(found.values())


def env_names(cls: type[BaseSettings]) -> dict[str, str]:
    """{environment variable: field name} of a settings class (env prefix + field, or the field's alias)."""
    prefix = cls.model_config.get("env_prefix", "")
    names = {}
    for field_name, field in cls.model_fields.items():
        alias = field.validation_alias
        names[(alias if isinstance(alias, str) else f"{prefix}{field_name}").upper()] = field_name
    return names


def direct_reads() -> set[str]:
    """SPECWATCH_* names read with os.environ[...] / os.environ.get / os.getenv anywhere in the code."""
    names = set()
    for path in [*ROOT.glob("service/**/*.py"), *ROOT.glob("workers/**/*.py"), *ROOT.glob("migrations/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv", "environ.get", "getenv"):
                key = node.args[0] if node.args else None
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
                key = node.slice
            else:
                continue
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("SPECWATCH_"):
                names.add(key.value)
    return names


def compose_variables() -> set[str]:
    """The variables the deployment's compose files interpolate (not CI's override, whose are its script's)."""
    files = (*COMPOSE_FILES, COMPOSE_PODMAN, COMPOSE_PODMAN_CPU)
    return {match["name"] for file in files for match in INTERPOLATION.finditer((ROOT / file).read_text())}


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in os.environ if name.startswith("SPECWATCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_every_setting_is_in_env_example() -> None:
    documented = set(env_example())
    read = {name for cls in settings_classes() for name in env_names(cls)} | (direct_reads() - DIRECT_READS_NOT_IN_ENV_EXAMPLE)
    assert read - documented == set(), "settings missing from .env.example"


def test_every_env_example_entry_is_read() -> None:
    read = {name for cls in settings_classes() for name in env_names(cls)} | direct_reads()
    unread = set(env_example()) - read - compose_variables() - COMPOSE_CLI_VARIABLES
    assert unread == set(), "entries of .env.example that nothing reads"


def test_compose_variables_are_documented() -> None:
    assert compose_variables() - set(env_example()) == set()


@pytest.mark.usefixtures("clean_environment")
def test_documented_defaults_are_the_code_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commented-out ``NAME=value`` line parses to the field's default (an empty value: computed or unset)."""
    entries = env_example()
    for cls in settings_classes():
        default = cls(_env_file=None)
        for name, field_name in env_names(cls).items():
            commented, value = entries[name]
            if not commented or not value:
                continue
            with monkeypatch.context() as patch:
                patch.setenv(name, value)
                assert getattr(cls(_env_file=None), field_name) == getattr(default, field_name), name


@pytest.mark.usefixtures("clean_environment")
def test_env_example_as_given_refuses_to_run_without_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its active values are valid, and its empty webhook secret is refused (SPECWATCH_ENV=prod), not accepted."""
    from pydantic import ValidationError

    from service.settings import Settings

    active = {name: value for name, (commented, value) in env_example().items() if not commented}
    assert active["SPECWATCH_ENV"] == "prod"
    assert not active["SPECWATCH_WEBHOOK_SECRET"]
    for name, value in active.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match="SPECWATCH_WEBHOOK_SECRET is empty"):
        Settings(_env_file=None)
    monkeypatch.setenv("SPECWATCH_WEBHOOK_SECRET", "hook-secret")
    for cls in settings_classes():
        cls(_env_file=None)
