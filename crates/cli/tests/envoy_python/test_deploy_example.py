"""deploy/envoy/envoy.yaml read by Envoy's own configuration messages
(`envoy.config.bootstrap.v3.Bootstrap` from xds-protos): every field
name, enum and typed_config `@type` must be one Envoy knows, so a typo
in the example fails here rather than at `docker compose up`. How it is
wired to Charon (ports, descriptors, the limit reached) is checked by
`crates/cli/tests/cli/deploy_files.rs` against a real server.
"""

import os

import pytest
import yaml
from google.protobuf import json_format

from envoy.config.bootstrap.v3 import bootstrap_pb2

# The typed_config messages the example names, registered for `@type`.
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # noqa: F401
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401

EXAMPLE = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "..", "deploy", "envoy", "envoy.yaml"
)


def load(text):
    bootstrap = bootstrap_pb2.Bootstrap()
    json_format.ParseDict(yaml.safe_load(text), bootstrap)
    return bootstrap


def test_the_example_is_a_valid_envoy_bootstrap():
    with open(EXAMPLE) as f:
        bootstrap = load(f.read())
    clusters = {c.name for c in bootstrap.static_resources.clusters}
    assert clusters == {"charon", "upstream"}
    hcm = bootstrap.static_resources.listeners[0].filter_chains[0].filters[0]
    assert hcm.typed_config.type_url.endswith("v3.HttpConnectionManager")


def test_a_misspelt_field_is_refused():
    with open(EXAMPLE) as f:
        text = f.read()
    assert "failure_mode_deny:" in text
    with pytest.raises(json_format.ParseError):
        load(text.replace("failure_mode_deny:", "failure_mode_denied:"))
