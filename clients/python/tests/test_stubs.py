"""The checked-in stubs are those protoc makes from the protos today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent
CHECKED_IN = PKG / "src" / "charon_client" / "_pb"
PROTOS = ("limiter", "capacity")
FILES = tuple(
    f"{proto}{suffix}"
    for proto in PROTOS
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
)


def test_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(PKG / "gen_stubs.py"), str(tmp_path)], check=True, capture_output=True
    )
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(FILES), f"gen_stubs.py made {made}"
    stale = [
        name
        for name in FILES
        if not (CHECKED_IN / name).exists()
        or (tmp_path / name).read_text() != (CHECKED_IN / name).read_text()
    ]
    assert not stale, f"{stale} differ from proto/charon/v1/*.proto: run gen_stubs.py"
