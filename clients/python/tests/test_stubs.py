"""The checked-in stubs are those protoc makes from the proto today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent
CHECKED_IN = PKG / "src" / "charon_client" / "_pb"
FILES = ("limiter_pb2.py", "limiter_pb2.pyi", "limiter_pb2_grpc.py", "limiter_pb2_grpc.pyi")


def test_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(PKG / "gen_stubs.py"), str(tmp_path)], check=True, capture_output=True
    )
    stale = [
        name for name in FILES if (tmp_path / name).read_text() != (CHECKED_IN / name).read_text()
    ]
    assert not stale, f"{stale} differ from proto/charon/v1/limiter.proto: run gen_stubs.py"
