"""The HTTP API fuzzed from its own OpenAPI description with schemathesis:
generated bodies and parameters for every route, against the tiny model.
No answer is a 5xx, every status and content type is one the description
declares, every body matches its schema (OpenAI's error object for every
4xx, ollama's {"error": "..."} under /api/, Anthropic's under /v1/messages),
and the server answers /health after it all."""
import os

import pytest
import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance
from hypothesis import HealthCheck, given, settings

from goosedump.model import load
from goosedump.options import Options
from goosedump.server.app import create_app


@pytest.fixture(scope="module")
def api_schema(tiny_path):
    model = load(tiny_path, n_ctx=256, options=Options.from_env(prompt_cache="off"))
    app = create_app(model, model_name="m")
    yield schemathesis.openapi.from_asgi("/openapi.json", app)
    model.close()


def test_every_route_from_its_schema(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/chat/completions", "/v1/completions", "/v1/responses",
                                               "/v1/models", "/health", "/metrics", "/api/chat", "/api/generate",
                                               "/api/tags", "/api/show", "/api/ps", "/api/version",
                                               "/completion", "/tokenize", "/detokenize", "/apply-template", "/props",
                                               "/v1/responses/input_tokens", "/v1/chat/completions/input_tokens",
                                               "/v1/messages", "/v1/messages/count_tokens"}
    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=int(os.environ.get("GOOSEDUMP_FUZZ_EXAMPLES", "40")), deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def check(case):
            response = case.call()
            # a request can fit the schema and still be refused (a tool message
            # without its call's id, a temperature below 0): that is a 400, not a defect
            case.validate_response(response, excluded_checks=[positive_data_acceptance])
            assert response.status_code < 500, response.text[:500]
            if response.status_code >= 400:
                error = response.json()["error"]
                if op.path.startswith("/api/"):
                    assert isinstance(error, str) and error
                elif op.path.startswith("/v1/messages"):
                    assert response.json()["type"] == "error" and set(error) == {"type", "message"} and error["message"]
                else:
                    assert set(error) == {"message", "type", "param", "code"} and error["message"]
        check()
