"""SPEC §11 through Envoy's own generated Python stubs (PyPI `xds-protos`)
against real `charon serve` processes, in the in-memory store and in the
Redis store (every test that takes `serve` runs in both). Limits are per
hour or per day, so nothing refills while a test runs.

Run by `cargo test -p charon --test cli envoy_python:: -- --ignored`, or
`crates/cli/tests/envoy_python/run.sh` (see docs/envoy.md).
"""

import os
import subprocess
import tempfile
import time

import grpc
import pytest
from google.protobuf.wrappers_pb2 import UInt64Value

from conftest import charon_bin
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit

CONFIG = """
resources:
  - { name: api/search, kind: bucket, burst: 3, count: 3, period: 1h }
  - { name: api/login, kind: window, algorithm: fixed, limit: 2, window: 1d }
  - name: api/burst
    kind: rate
    tiers:
      - { limit: 2, window: 1h }
      - { limit: 1, window: 1h, active: 1h, cooldown: 1h }
envoy:
  headers: true
  domains:
    - domain: edge
      descriptors:
        - key: generic_key
          value: search
          descriptors:
            - key: remote_address
              mask: {}
              resource: api/search
        - key: user
          resource: api/login
        - key: tenant
          rate_limit: { unit: day, requests_per_unit: 2 }
          shadow_mode: true
        - key: plan
          rate_limit: { unit: day, requests_per_unit: 1 }
        - key: health
          unlimited: true
        - key: burst
          resource: api/burst
"""


def descriptor(*entries, hits=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


def call(server, *descriptors, domain="edge", hits_addend=0, timeout=30):
    return server.stub.ShouldRateLimit(
        rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits_addend),
        timeout=timeout,
    )


def one(server, *entries, hits=None, domain="edge"):
    """One descriptor, one call: its status."""
    r = call(server, descriptor(*entries, hits=hits), domain=domain)
    assert len(r.statuses) == 1
    assert r.overall_code == r.statuses[0].code, r
    return r.statuses[0]


def headers(response):
    return {h.key: h.value for h in response.response_headers_to_add}


def test_matching_value_less_keys_and_ipv6_masked_to_48(serve):
    s = serve(CONFIG)
    # Three addresses of one /48 share the bucket of 3.
    for i, addr in enumerate(["2001:db8:abcd:1::1", "2001:db8:abcd:2::2", "2001:db8:abcd:3::3"]):
        st = one(s, ("generic_key", "search"), ("remote_address", addr))
        assert st.code == OK, (addr, st)
        assert st.limit_remaining == 2 - i
    st = one(s, ("generic_key", "search"), ("remote_address", "2001:db8:abcd:ffff::9"))
    assert st.code == OVER, "the /48 is spent"
    # Another /48, and IPv4 addresses (each its own /32), have their own buckets.
    for addr in ["2001:db8:abce::1", "203.0.113.7", "203.0.113.8"]:
        assert one(s, ("generic_key", "search"), ("remote_address", addr)).code == OK, addr
    # A value-less key: each value is its own domain.
    assert one(s, ("user", "ann"), hits=2).code == OK
    assert one(s, ("user", "ann")).code == OVER
    assert one(s, ("user", "ben")).code == OK
    # A value the tree does not know is not limited; neither is a node
    # that names no action.
    for entries in [
        [("generic_key", "other"), ("remote_address", "203.0.113.7")],
        [("generic_key", "search")],
        [("unknown_key", "x")],
    ]:
        st = one(s, *entries)
        assert st.code == OK and not st.HasField("current_limit"), (entries, st)
    # An invalid address is limited by its text, never an error.
    assert one(s, ("generic_key", "search"), ("remote_address", "not-an-ip")).code == OK


def test_statuses_carry_limit_remaining_and_reset(serve):
    s = serve(CONFIG)
    st = one(s, ("generic_key", "search"), ("remote_address", "198.51.100.1"))
    assert st.current_limit.name == "api/search"
    assert st.current_limit.requests_per_unit == 3
    assert st.limit_remaining == 2
    assert st.HasField("duration_until_reset")
    assert 0 < st.duration_until_reset.ToSeconds() <= 3600
    # An inline limit without a `name` has none (as in envoyproxy/ratelimit),
    # and reports its unit.
    st = one(s, ("plan", "gold"))
    assert (st.current_limit.name, st.current_limit.requests_per_unit) == ("", 1)
    assert st.current_limit.unit == Unit.DAY
    assert st.limit_remaining == 0
    assert 0 < st.duration_until_reset.ToSeconds() <= 86400
    # A window of exactly a day reports its unit too.
    st = one(s, ("user", "zed"))
    assert (st.current_limit.requests_per_unit, st.current_limit.unit) == (2, Unit.DAY)
    assert st.limit_remaining == 1
    # Over: remaining 0, and the status still says which limit.
    st = one(s, ("plan", "gold"))
    assert st.code == OVER and st.limit_remaining == 0
    assert (st.current_limit.requests_per_unit, st.current_limit.unit) == (1, Unit.DAY)


def test_hits_addend_and_dry_runs(serve):
    s = serve(CONFIG)
    # The descriptor's own hits_addend: 2 of 2.
    st = one(s, ("user", "alice"), hits=2)
    assert st.code == OK and st.limit_remaining == 0, st
    assert one(s, ("user", "alice")).code == OVER
    # The request's hits_addend when the descriptor has none.
    st = call(s, descriptor(("user", "bob")), hits_addend=2).statuses[0]
    assert st.code == OK and st.limit_remaining == 0, st
    # The descriptor's beats the request's.
    st = call(s, descriptor(("user", "bea"), hits=1), hits_addend=2).statuses[0]
    assert st.code == OK and st.limit_remaining == 1, st
    # More than the limit at once is over, whole or nothing.
    assert one(s, ("user", "carl"), hits=3).code == OVER
    assert one(s, ("user", "carl"), hits=2).code == OK
    # hits_addend 0 is a dry run: answered as if granted, recorded never.
    for _ in range(3):
        st = one(s, ("user", "carol"), hits=0)
        assert st.code == OK and st.limit_remaining == 1, st
    assert one(s, ("user", "carol"), hits=2).code == OK, "the dry runs recorded nothing"
    # A dry run on a spent limit is over.
    assert one(s, ("user", "carol"), hits=0).code == OVER


def test_one_descriptor_over_records_nothing_for_the_others(serve):
    s = serve(CONFIG)
    assert one(s, ("plan", "p1")).code == OK
    r = call(
        s,
        descriptor(("user", "dave")),
        descriptor(("generic_key", "search"), ("remote_address", "10.0.0.1")),
        descriptor(("health", "x")),
        descriptor(("plan", "p1")),
    )
    assert r.overall_code == OVER, r
    assert [st.code for st in r.statuses] == [OK, OK, OK, OVER], "one status per descriptor, in order"
    assert r.statuses[0].limit_remaining == 1, "as decided in the batch"
    assert not r.statuses[2].HasField("current_limit"), "unlimited"
    # Nothing was recorded for dave nor for 10.0.0.1: their whole limits
    # are still there.
    assert one(s, ("user", "dave"), hits=2).code == OK
    assert one(s, ("generic_key", "search"), ("remote_address", "10.0.0.1"), hits=3).code == OK
    # Two descriptors on one limit in one call count together.
    r = call(s, *[descriptor(("user", "eve"))] * 3)
    assert r.overall_code == OVER, r
    assert one(s, ("user", "eve"), hits=2).code == OK


def test_burst_tiers_are_limited_and_all_or_nothing(serve):
    s = serve(CONFIG)
    st = one(s, ("burst", "a"), hits=2)
    assert st.code == OK, st
    # The status describes the tier that decided: tier 1, 2 an hour.
    assert (st.current_limit.requests_per_unit, st.current_limit.unit) == (2, Unit.HOUR), st
    assert one(s, ("burst", "a")).code == OK, "a burst into tier 2"
    assert one(s, ("burst", "a")).code == OVER
    # Over on the tiers: nothing recorded for ivy's window.
    r = call(s, descriptor(("user", "ivy")), descriptor(("burst", "a")))
    assert r.overall_code == OVER, r
    assert [st.code for st in r.statuses] == [OK, OVER]
    assert one(s, ("user", "ivy"), hits=2).code == OK
    # Over elsewhere: no hit recorded in the tiers.
    r = call(s, descriptor(("burst", "b"), hits=2), descriptor(("user", "ivy")))
    assert r.overall_code == OVER, r
    assert one(s, ("burst", "b"), hits=2).code == OK, "b's 2 hits of tier 1 are all there"


def test_headers(serve):
    s = serve(CONFIG)
    r = call(s, descriptor(("user", "fay")), descriptor(("generic_key", "search"), ("remote_address", "10.9.9.9")))
    assert r.overall_code == OK
    h = headers(r)
    # The limited descriptor with the least remaining: fay's window (1 of 2 left).
    assert h["RateLimit-Limit"] == "2", h
    assert h["RateLimit-Remaining"] == "1", h
    assert 0 < int(h["RateLimit-Reset"]) <= 86400, h
    assert "Retry-After" not in h, "within limits"
    assert one(s, ("user", "fay")).code == OK
    r = call(s, descriptor(("user", "fay")))
    assert r.overall_code == OVER
    h = headers(r)
    assert h["RateLimit-Remaining"] == "0", h
    assert 0 < int(h["Retry-After"]) <= 86400, h


def test_shadow_mode_records_and_answers_ok(serve):
    s = serve(CONFIG)
    remaining = []
    for _ in range(3):
        st = one(s, ("tenant", "acme"))
        assert st.code == OK, st
        remaining.append(st.limit_remaining)
    assert remaining == [1, 0, 0], "recorded, though answered OK"
    # A shadowed descriptor over its limit does not stop the others.
    r = call(s, descriptor(("tenant", "acme")), descriptor(("user", "gus"), hits=2))
    assert r.overall_code == OK, r
    assert one(s, ("user", "gus")).code == OVER, "gus recorded"
    _, metrics = s.http_get("/metrics")
    assert 'charon_envoy_shadow_total{domain="edge",node="envoy/edge/tenant"}' in metrics


def test_global_shadow_mode(serve):
    # As envoyproxy/ratelimit's SHADOW_MODE: each status says what it is
    # (OVER_LIMIT stays visible to Envoy's stats), the call is OK.
    s = serve(CONFIG.replace("headers: true", "headers: true\n  shadow_mode: true"))
    assert one(s, ("plan", "x")).code == OK
    r = call(s, descriptor(("plan", "x")))
    assert r.overall_code == OK, r
    assert r.statuses[0].code == OVER and r.statuses[0].limit_remaining == 0, r


def test_unlimited_is_ok_and_touches_nothing(serve):
    s = serve(CONFIG)
    for _ in range(5):
        st = one(s, ("health", "ok"), hits=1000)
        assert st.code == OK and not st.HasField("current_limit"), st
    assert "Retry-After" not in headers(call(s, descriptor(("health", "ok"))))


def test_bad_input_is_invalid_argument_and_the_server_keeps_serving(serve):
    s = serve(CONFIG)
    user = lambda: descriptor(("user", "hal"))  # noqa: E731
    cases = {
        "an empty value": [user(), descriptor(("user", ""))],
        "a long value": [user(), descriptor(("user", "v" * 2000))],
        "10,000 descriptors": [user() for _ in range(10_000)],
        "hits_addend 2^64 - 1": [user(), descriptor(("user", "hal"), hits=2**64 - 1)],
    }
    for what, descriptors in cases.items():
        with pytest.raises(grpc.RpcError) as e:
            call(s, *descriptors)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
    # An unknown domain is OK (`unknown_domain: ok`, the default), as the
    # peers answer it.
    r = call(s, user(), domain="nowhere")
    assert r.overall_code == OK and not r.statuses[0].HasField("current_limit"), r
    assert one(s, ("user", "hal"), hits=2).code == OK, "nothing was recorded for hal"


def test_a_stopped_redis_is_unavailable_not_a_hang(redis):
    s = None
    try:
        from conftest import Charon

        s = Charon(CONFIG, ["--store", redis.url, "--store-timeout", "1s", "--liveness-ttl", "1s"])
        assert one(s, ("user", "ida")).code == OK
        redis.stop()
        # The gRPC deadline is a guard against a hang, not a measure of
        # speed: the store's operation timeout (1 s) answers well before,
        # and a hang would end in DEADLINE_EXCEEDED, not UNAVAILABLE.
        with pytest.raises(grpc.RpcError) as e:
            call(s, descriptor(("user", "ida")), timeout=15)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        md = dict(e.value.trailing_metadata() or ())
        assert md.get("charon-error-class") == "server", md
        # Unlimited and unmatched descriptors need no store.
        assert one(s, ("health", "ok")).code == OK
        assert one(s, ("unknown_key", "x")).code == OK
        redis.resume()
        # A fresh key: the call answered UNAVAILABLE was already written to
        # the stopped Redis, which may run it when it resumes.
        assert one(s, ("user", "ivy")).code == OK, "serving again once Redis answers"
    finally:
        redis.resume()
        if s is not None:
            s.close()


# The paper's §5.2 example, in envoyproxy/ratelimit's own format (its
# README's "Example 2"): at most 100 messages a day to one phone number, at
# most 5 of them marketing messages. Envoy sends, for a marketing message,
# both descriptors: (message_type=marketing, to_number=N) and (to_number=N).
MESSAGING = """\
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
"""


def imported_messaging():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "messaging.yaml")
        with open(path, "w") as f:
            f.write(MESSAGING)
        out = subprocess.run(
            [charon_bin(), "config", "import", "--from", "envoy-ratelimit", path],
            capture_output=True, text=True, timeout=60,
        )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_papers_messaging_example_imported_from_envoy_ratelimit(serve):
    s = serve(imported_messaging())

    def marketing(number):
        return call(s, descriptor(("message_type", "marketing"), ("to_number", number)),
                    descriptor(("to_number", number)), domain="messaging")

    def plain(number):
        return call(s, descriptor(("to_number", number)), domain="messaging")

    # 5 marketing messages a day to one number; the 6th is over.
    for i in range(5):
        r = marketing("+15550001")
        assert r.overall_code == OK, (i, r)
        assert r.statuses[0].current_limit.requests_per_unit == 5
        assert r.statuses[0].current_limit.unit == Unit.DAY
        assert r.statuses[1].current_limit.requests_per_unit == 100
    r = marketing("+15550001")
    assert r.overall_code == OVER
    assert [st.code for st in r.statuses] == [OVER, OK]
    # Another number has its own counts.
    assert marketing("+15550002").overall_code == OK
    # Other messages to the first number: 100 a day in all, the 6 marketing
    # ones included: envoyproxy/ratelimit counts every descriptor of a call,
    # the rejected one too (`record: every_hit`).
    for i in range(94):
        r = plain("+15550001")
        assert r.overall_code == OK, (i, r)
    r = plain("+15550001")
    assert r.overall_code == OVER
    assert r.statuses[0].limit_remaining == 0
    # And now marketing is over on both counts.
    assert [st.code for st in marketing("+15550001").statuses] == [OVER, OVER]
