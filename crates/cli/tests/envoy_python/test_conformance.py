"""The peers' own tests, transcribed as data (conformance/*.yaml), run
against real `charon serve` processes through Envoy's generated stubs, in
the in-memory store and on a private Redis: each peer file is imported with
`charon config import`, served, and called as the case says; a file the
peer refuses must be refused by the import with the peer's reason (exit 1,
nothing written). Every case names its source file at the peers' commit.

Limits counted per second or minute are checked within one window: a case
that says `align` waits for a fresh one first, and is run once more if its
calls still crossed into the next (a loaded machine), never more.
"""

import os
import subprocess
import tempfile
import time

import grpc
import pytest
import yaml
from google.protobuf.wrappers_pb2 import UInt64Value

from conftest import charon_bin
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.type.v3 import ratelimit_unit_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
CODES = {"OK": rls_pb2.RateLimitResponse.OK, "OVER": rls_pb2.RateLimitResponse.OVER_LIMIT}
UNITS = rls_pb2.RateLimitResponse.RateLimit.Unit
ALIGN = {"second": 1.0, "minute": 60.0}


def load(peer):
    with open(os.path.join(HERE, "conformance", f"{peer}.yaml")) as f:
        doc = yaml.safe_load(f)
    return [(peer, doc["repo"], doc["commit"], case) for case in doc["cases"]]


CASES = load("envoyproxy_ratelimit") + load("limitador")
FORMATS = {"envoyproxy_ratelimit": "envoy-ratelimit", "limitador": "limitador"}


def value(v, i):
    """A case value; `=expr` is evaluated with `i`."""
    if isinstance(v, str) and v.startswith("="):
        return eval(v[1:], {"max": max, "min": min, "str": str}, {"i": i})
    return v


def import_files(peer, case, dirname):
    paths = []
    for f in case["files"]:
        path = os.path.join(dirname, f["name"])
        with open(path, "w") as out:
            out.write(f["text"])
        paths.append(path)
    return subprocess.run(
        [charon_bin(), "config", "import", "--from", FORMATS[peer],
         *case.get("import_args", []), *paths],
        capture_output=True, text=True, timeout=60,
    )


def descriptor(spec, i):
    if isinstance(spec, dict):
        entries, hits, limit = spec["e"], spec.get("hits"), spec.get("limit")
    else:
        entries, hits, limit = spec, None, None
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=str(value(v, i)))
                 for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    if limit is not None:
        d.limit.requests_per_unit = limit[0]
        d.limit.unit = ratelimit_unit_pb2.RateLimitUnit.Value(limit[1])
    return d


def default_domain(case):
    for f in case["files"]:
        for line in f["text"].splitlines():
            if line.startswith("domain:"):
                return line.split(":", 1)[1].strip()
    return "test-domain"


def check_status(got, want, i, where):
    if "code" in want:
        assert got.code == CODES[value(want["code"], i)], f"{where}: code: {got}"
    if want.get("none"):
        assert not got.HasField("current_limit"), f"{where}: no limit: {got}"
    if "rpu" in want:
        assert got.current_limit.requests_per_unit == value(want["rpu"], i), f"{where}: {got}"
    if "unit" in want:
        assert got.current_limit.unit == UNITS.Value(want["unit"]), f"{where}: unit: {got}"
    if "name" in want:
        assert got.current_limit.name == want["name"], f"{where}: name: {got}"
    if "remaining" in want:
        assert got.limit_remaining == value(want["remaining"], i), f"{where}: remaining: {got}"
    if "reset_max" in want:
        s = got.duration_until_reset.seconds
        assert got.duration_until_reset.nanos == 0, f"{where}: whole seconds: {got}"
        assert 0 <= s <= want["reset_max"], f"{where}: reset {s}: {got}"


def check_headers(got, want, i, where):
    headers = {h.key: h.value for h in got.response_headers_to_add}
    if not want:
        assert headers == {}, f"{where}: headers: {headers}"
    for k, v in want.items():
        v = value(v, i)
        assert k in headers, f"{where}: no {k} in {headers}"
        if isinstance(v, str) and v.startswith("<="):
            assert 0 <= int(headers[k]) <= int(v[2:]), f"{where}: {k}: {headers}"
        else:
            assert headers[k] == v, f"{where}: {k}: {headers}"


def run_calls(server, case, where):
    domain = default_domain(case)
    for n, call in enumerate(case["calls"]):
        for i in range(call.get("repeat", 1)):
            at = f"{where}, call {n}, i={i}"
            request = rls_pb2.RateLimitRequest(
                domain=call.get("domain", domain),
                descriptors=[descriptor(d, i) for d in call["d"]],
                hits_addend=call.get("hits", 0),
            )
            if "error" in call:
                with pytest.raises(grpc.RpcError) as e:
                    server.stub.ShouldRateLimit(request, timeout=30)
                assert e.value.code().name == call["error"], at
                continue
            r = server.stub.ShouldRateLimit(request, timeout=30)
            want = call.get("want", {})
            if "overall" in want:
                assert r.overall_code == CODES[value(want["overall"], i)], f"{at}: {r}"
            if "statuses_len" in want:
                assert len(r.statuses) == want["statuses_len"], f"{at}: {r}"
            if "statuses" in want:
                assert len(r.statuses) == len(want["statuses"]), f"{at}: {r}"
                for j, (g, w) in enumerate(zip(r.statuses, want["statuses"])):
                    check_status(g, w, i, f"{at}, status {j}")
            if "headers" in want:
                check_headers(r, want["headers"], i, at)


def wait_for_fresh_window(unit):
    """Sleeps into the next window unless enough of this one is ahead: 60 %
    of a second, 10 s of a minute (a case runs in about a second; one that
    crosses a window anyway is run again, below)."""
    left = unit - (time.time() % unit)
    if left < min(0.6 * unit, 10.0):
        time.sleep(left + 0.01)


@pytest.mark.parametrize(
    "peer,repo,commit,case", CASES,
    ids=[f"{p}: {c['name']}" for p, _, _, c in CASES],
)
def test_peer_case(serve, peer, repo, commit, case):
    where = f"{repo}@{commit} {case['source']} ({case['name']}, {serve.store})"
    with tempfile.TemporaryDirectory(prefix="charon-conformance-") as d:
        imported = import_files(peer, case, d)
        if "refused" in case:
            assert imported.returncode == 1, f"{where}: imported:\n{imported.stdout}"
            assert imported.stdout == "", f"{where}: nothing is written"
            assert case["refused"] in imported.stderr, f"{where}:\n{imported.stderr}"
            return
        assert imported.returncode == 0, f"{where}:\n{imported.stderr}"
        config = imported.stdout
    unit = ALIGN.get(case.get("align"))
    for attempt in range(2):
        server = serve(config)
        start = time.time()
        if unit:
            wait_for_fresh_window(unit)
            start = time.time()
        try:
            run_calls(server, case, where)
            return
        except AssertionError:
            crossed = unit and int(start // unit) != int(time.time() // unit)
            if not crossed or attempt == 1:
                raise
        finally:
            server.close()
