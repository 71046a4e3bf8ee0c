"""What authorizing a stream costs `serve`: its CPU per request for a stream of one job and for
streams of 50 named jobs under tokens of growing size, this tree against a baseline commit.

Run from the repository root: `.venv/bin/python -m bench.authorization_bench
[--baseline-ref REF] [--requests 200] [--rounds 3]`.

Both gateways are `eco-router serve --in-memory` with a JWT secret and default settings
otherwise, started side by side; each round runs every case on each of them in turn (the
order alternating from round to round), and every figure is the median over the rounds of the
gateway's CPU (utime + stime from /proc) over `--requests` sequential requests, divided by
their number. A request sends its head, reads the response's head and closes: a granted
stream is opened (every job subscribed) and ended by the disconnect, a refused one answered.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import jwt

from bench.baseline_source import BaselineSource, baseline_source
from bench.gateway_processes import free_port
from bench.router_process import RouterProcess

SECRET = "a-benchmark-secret-that-is-long-enough-for-hs256"
DOMAIN = "scan"
NAMED_JOBS = 50
READ_TIMEOUT_S = 10.0


def job_id(number: int) -> str:
    """An id of 18 characters: a token naming 1,000 of them is about 28 KB."""
    return f"job-{number:04d}-xxxxxxxxx"


def token_for(jobs: int) -> str:
    claims: dict[str, object] = {"domain": DOMAIN, "jobs": [job_id(n) for n in range(jobs)]}
    claims["exp"] = int(time.time()) + 3600
    return jwt.encode(claims, SECRET, algorithm="HS256")


@dataclass(frozen=True, slots=True)
class Case:
    """One kind of request: its path and its token."""

    title: str
    path: str
    token: str


def cases() -> list[Case]:
    many = "/api/v1/streams?" + "&".join(f"job={DOMAIN}:{job_id(n)}" for n in range(NAMED_JOBS))
    one = f"/api/v1/{DOMAIN}/{job_id(0)}/events"
    # The most jobs whose token stays under 8 KiB.
    under_8k = max(n for n in range(NAMED_JOBS, 400) if len(token_for(n)) <= 8192)
    return [
        Case("1 job, token of 1 job", one, token_for(1)),
        Case(f"{NAMED_JOBS} jobs, token of {NAMED_JOBS} jobs", many, token_for(NAMED_JOBS)),
        Case(f"{NAMED_JOBS} jobs, token of {under_8k} jobs", many, token_for(under_8k)),
        Case(f"{NAMED_JOBS} jobs, token of 1,000 jobs", many, token_for(1000)),
    ]


class InMemoryGateway(RouterProcess):
    """`eco-router serve --in-memory` of a source tree, with a JWT secret, on a free port."""

    def __init__(self, title: str, source: BaselineSource | None) -> None:
        self.title = title
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_ROUTER_", "REDIS_"))}
        env.update(
            EVENT_ROUTER_JWT_SECRET=SECRET,
            # Every request comes from this process: no cap per address.
            EVENT_ROUTER_SSE_MAX_PER_CLIENT="100000",
            EVENT_ROUTER_HTTP_MAX_CONNECTIONS_PER_CLIENT="0",
        )
        if source is not None:
            env["PYTHONPATH"] = source.pythonpath()
        command = [sys.executable if source is None else source.python]
        command += ["-m", "eco_router.entrypoints.cli", "serve", "--in-memory"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        super().__init__(command, env=env, name="gateway")

    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, case: Case) -> int:
        """The status of one request of `case`, its connection closed once the head is in."""
        head = (
            f"GET {case.path} HTTP/1.1\r\nHost: gateway\r\n"
            f"Authorization: Bearer {case.token}\r\n\r\n"
        ).encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=READ_TIMEOUT_S) as sock:
            sock.sendall(head)
            received = b""
            while b"\r\n" not in received:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
        return int(received.split(b" ", 2)[1])

    def cpu_ms_per_request(self, case: Case, requests: int, statuses: Counter[int]) -> float:
        before = self.cpu_seconds()
        for _ in range(requests):
            statuses[self.request(case)] += 1
        # The last disconnects are handled after the reply: let them land in the figure.
        time.sleep(0.2)
        return (self.cpu_seconds() - before) * 1000 / requests


@contextlib.contextmanager
def gateways(baseline_ref: str | None) -> Iterator[list[InMemoryGateway]]:
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(InMemoryGateway("this tree", None))]
        if baseline_ref is not None:
            source = stack.enter_context(baseline_source(baseline_ref))
            started.append(stack.enter_context(InMemoryGateway(source.title, source)))
        for gateway in started:
            gateway.wait_ready()
        yield started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-ref", help="a commit to compare with (e.g. HEAD~3)")
    parser.add_argument("--requests", type=int, default=200, help="requests per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    all_cases = cases()
    figures: dict[tuple[str, str], list[float]] = {}
    statuses: dict[tuple[str, str], Counter[int]] = {}
    with gateways(args.baseline_ref) as started:
        for case in all_cases:  # warm-up: imports, first connections
            for gateway in started:
                for _ in range(5):
                    gateway.request(case)
        for round_number in range(args.rounds):
            order = started if round_number % 2 == 0 else started[::-1]
            for case in all_cases:
                for gateway in order:
                    key = (gateway.title, case.title)
                    seen = statuses.setdefault(key, Counter())
                    cpu = gateway.cpu_ms_per_request(case, args.requests, seen)
                    figures.setdefault(key, []).append(cpu)
    width = max(len(c.title) for c in all_cases) + 2
    print(f"serve CPU per request, ms (median of {args.rounds} rounds of {args.requests})")
    for gateway in started:
        print(f"\n{gateway.title}")
        for case in all_cases:
            key = (gateway.title, case.title)
            shown = ", ".join(f"{s}: {n}" for s, n in sorted(statuses[key].items()))
            token_kb = len(case.token) / 1024
            print(
                f"  {case.title:<{width}} token {token_kb:5.1f} KiB  "
                f"{statistics.median(figures[key]):7.2f} ms  ({shown})"
            )


if __name__ == "__main__":
    main()
