"""Property test of the REST service against its own OpenAPI document, over real HTTP.

schemathesis generates valid and invalid requests for every operation the document declares;
no input may produce a 5xx, and every answer must match the document (status, content type,
body schema, 401 without the key). Example counts are modest so CI stays fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from advisor.store import connect
from api.auth import create_key
from tests.test_api import serve

KEY: dict[str, str] = {}


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    """The service with an API key configured, so the document's bearer security is enforced
    (schemathesis also checks that requests without the key get 401)."""
    db: Path = tmp_path_factory.mktemp("schemathesis") / "advisor.duckdb"
    con = connect(db)
    KEY["Authorization"] = f"Bearer {create_key(con, 'schemathesis')[1]}"
    con.close()
    with serve(db) as url:
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


# POST /v1/calibrations is left out: a generated body names arbitrary server URLs, and a job
# that got past planning would connect to them. This machine's tests send traffic to loopback
# only; that endpoint's validation is tested by hand in test_api.py.
schema = schemathesis.pytest.from_fixture("api_schema").exclude(
    method="POST", path="/v1/calibrations"
)


# In CI (CI=true) the examples are derandomized, so a run is reproducible and cannot fail by
# luck; run locally without it to explore new inputs.
@schema.parametrize()
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("CI") == "true",
)
def test_no_input_breaks_the_service(case: schemathesis.Case) -> None:
    # positive_data_acceptance is left out on purpose: a schema-valid name that is not in the
    # catalogue (or an id that does not exist) gets 400/404 by design, with the valid names.
    case.call_and_validate(headers=KEY, excluded_checks=[positive_data_acceptance])
