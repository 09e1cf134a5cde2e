"""Bounded API fuzzing of `embedserve serve` and `embedserve gateway` from their own schemas.

Every schemathesis check: never a 5xx, statuses / content types / headers / bodies as the schema
says, every body the schema allows answered (positive data acceptance: the document is the served
model's, api/openapi_contract.py; refusals JSON Schema cannot state are counted apart) and every
body it forbids refused, and healthy after. CI runs 20 cases per operation and mode on the server
and on the gateway (about 45 s each on 2 cores); the longer run of docs/reliability.md:

    EMBEDSERVE_FUZZ_EXAMPLES=1000 EMBEDSERVE_FUZZ_REPORT=fuzz.json pytest tests/unit/server/test_fuzz_api.py
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from embedserve.batch.settings import BatchSettings
from tests.helpers.fuzz import FuzzReport, checks, fuzz_api, threaded_server
from tests.helpers.inprocess import gateway_app, server_client

EXAMPLES = int(os.environ.get("EMBEDSERVE_FUZZ_EXAMPLES", "10"))  # CI time; 1000 finds more


def _record(name: str, report: FuzzReport) -> None:
    out = os.environ.get("EMBEDSERVE_FUZZ_REPORT")
    print(f"{name}: {report.cases} cases, statuses {dict(report.statuses)}, {report.server_errors} 5xx")
    print(f"  refusals JSON Schema cannot state: {dict(report.inexpressible)}")
    for op, mode, cases, seconds in report.timings:
        print(f"  {op} [{mode}]: {cases} cases in {seconds:.1f} s")
    if out:
        path = Path(out)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = {"cases": report.cases, "statuses": report.statuses, "failures": report.failures}
        path.write_text(json.dumps(data, indent=1, default=dict))


@pytest.fixture(scope="module")
def server(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    # Small limits, so that generated requests reach them (413 / 400 / 429 paths included); the
    # batch API on, with a small upload limit.
    batch = BatchSettings(tmp_path_factory.mktemp("batch"), max_file_bytes=1 << 14)
    with (
        server_client(qwen3_dir, max_inputs_per_request=16, max_body_bytes=1 << 16, batch=batch) as client,
        threaded_server(client.app) as url,
    ):
        yield client, url


def test_fuzzing_the_server_finds_no_5xx_and_no_schema_violation(server: tuple[TestClient, str]) -> None:
    client, url = server
    assert {"positive_data_acceptance", "negative_data_rejection"} <= {c.__name__ for c in checks()}
    report = fuzz_api(url, EXAMPLES)
    _record("server", report)
    assert report.cases >= 6 * EXAMPLES // 2
    assert report.server_errors == 0, report.statuses
    assert not report.failures, "\n".join(report.failures[:5])
    assert client.get("/health/ready").status_code == 200
    assert client.post("/v1/embeddings", json={"input": "after the fuzz"}).status_code == 200


def test_fuzzing_the_gateway_finds_no_5xx_and_no_schema_violation(
    server: tuple[TestClient, str], qwen3_dir: Path, tmp_path: Path
) -> None:
    client, _ = server
    gateway = gateway_app(
        client.app, qwen3_dir, max_inputs_per_request=16, max_body_bytes=1 << 16, batch_dir=tmp_path / "gw"
    )
    with threaded_server(gateway) as url:
        report = fuzz_api(url, EXAMPLES)
        _record("gateway", report)
        assert report.server_errors == 0, report.statuses
        assert not report.failures, "\n".join(report.failures[:5])
        assert TestClient(gateway).get("/health/ready").status_code == 200


def _model(kind: str, root: Path) -> Path:
    if kind == "colbert":
        from tests.helpers.tiny_multivector import build_colbert

        return build_colbert(root / "colbert")
    if kind == "splade":
        from tests.helpers.tiny_sparse import build_splade

        return build_splade(root / "splade")
    from tests.helpers.tiny_rerankers import build_cross_encoder

    return build_cross_encoder(root / "ce" / "bert-ce", "bert")


@pytest.mark.slow  # CI time: the dense decoder's document runs in CI (above)
# BGE-M3 is not yet: its document allows late chunking's span_pooling 'last', which an encoder refuses
@pytest.mark.parametrize("kind", ["colbert", "splade", "cross-encoder"])
def test_every_model_kinds_document_is_its_contract(kind: str, tmp_path: Path) -> None:
    """Each kind narrows the document its own way (no dense vectors: embedding_type required and no
    width; MaxSim rerank; a reranker's routes): every check passes on each."""
    with (
        server_client(_model(kind, tmp_path), max_inputs_per_request=16) as client,
        threaded_server(client.app) as url,
    ):
        report = fuzz_api(url, EXAMPLES // 2)
        _record(kind, report)
        assert report.server_errors == 0, report.statuses
        assert not report.failures, "\n".join(report.failures[:5])
