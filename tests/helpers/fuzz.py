"""API fuzzing from an app's own `/openapi.json` (schemathesis + hypothesis) over loopback.

`fuzz_api(base_url, examples)` runs every operation in positive mode (bodies the schema allows)
and negative mode (bodies it forbids), validates each response against the schema (status,
content type, headers, body) and counts cases and 5xx answers. `ThreadedServer` runs an ASGI app
on uvicorn in a thread on a free loopback port.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.failures import FailureGroup
from schemathesis.generation.modes import GenerationMode

from tests.helpers.server_process import free_port

# Every built-in check except those that judge our choices rather than the schema's truth.
_EXCLUDED = {
    "max_response_time",
    "missing_required_header",
    "unsupported_method",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
}


# The refusals of a schema-valid body that JSON Schema cannot state (api/openapi_contract.py):
# lengths of two lists that must match, spans within the string beside them, token counts.
INEXPRESSIBLE = re.compile(
    r"text_1 holds \d+ texts and text_2 \d+"
    r"|chunk_spans\[\d+\] \[\d+, \d+\) (is empty or outside|overlaps)"
    r"|has no content tokens to chunk|has no token of its own"  # late chunks vs the tokenizer
    r"|the document has \d+ chunks: one request answers at most \d+ vectors"
    r"|tokens exceed the limit of \d+ tokens"
    # BGE-M3's `dimensions` beside embedding_type sparse: statable, but schemathesis 4.32 cannot
    # generate from that rule beside the others (UnsupportedSchema); the description says it
    r"|dimensions does not apply to sparse vectors"
)


@dataclass
class FuzzReport:
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    inexpressible: Counter[str] = field(default_factory=Counter)  # such refusals, by operation
    timings: list[tuple[str, str, int, float]] = field(default_factory=list)  # op, mode, cases, seconds

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


@contextlib.contextmanager
def threaded_server(app: Any, **config: Any) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 in a thread (its lifespan already running elsewhere, or none)."""
    port = free_port()
    config = {"log_level": "warning", "lifespan": "off", **config}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def checks() -> list[Any]:
    from schemathesis.checks import CHECKS, load_all_checks

    load_all_checks()
    return [c for c in CHECKS.get_all() if getattr(c, "__name__", "") not in _EXCLUDED]


def _case_runner(
    base_url: str, checks: list[Any], report: FuzzReport, label: str, skip_5xx: frozenset[int]
) -> Callable[[Any], None]:
    def one_case(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=60)
        report.cases += 1
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=checks)
        except (AssertionError, FailureGroup) as e:  # one failure, or schemathesis' group of them
            if _only_rejected_positive(e) and INEXPRESSIBLE.search(response.text):
                report.inexpressible[label] += 1
            elif response.status_code not in skip_5xx:
                report.failures.append(f"{label} -> {response.status_code}: {str(e)[:1500]}")

    return one_case


def _only_rejected_positive(e: BaseException) -> bool:
    """Whether every failure in `e` is a schema-valid body refused (not a response's shape)."""
    failures = e.exceptions if isinstance(e, FailureGroup) else [e]
    return all(type(f).__name__ == "RejectedPositiveData" for f in failures)


# Aliases of /v1/rerank (the same handler and document): fuzzed once, under /v1/rerank.
ALIASES = frozenset({"/rerank", "/v2/rerank"})


def fuzz_api(
    base_url: str, examples: int, skip_5xx: frozenset[int] = frozenset(), skip_paths: frozenset[str] = ALIASES
) -> FuzzReport:
    """Up to `examples` cases per operation and mode. `skip_5xx`: statuses the caller expects
    (e.g. 503 while a gateway's pool is down) that are still validated but not failures;
    `skip_paths`: operations not fuzzed."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    report = FuzzReport()
    checks_run = checks()
    hypothesis_settings = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in skip_paths:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            label = f"{op.label} [{mode.value}]"
            one = _case_runner(base_url, checks_run, report, label, skip_5xx)
            run = hypothesis_settings(given(case=op.as_strategy(generation_mode=mode))(one))
            start, before = time.monotonic(), report.cases
            with contextlib.suppress(Unsatisfiable):  # nothing to break: no parameters, no body
                run()
            report.timings.append((op.label, mode.value, report.cases - before, time.monotonic() - start))
    return report
