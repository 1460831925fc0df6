"""Regenerates the checked-in gRPC stubs from proto/charon/v1/limiter.proto
and proto/charon/v1/capacity.proto.

    python gen_stubs.py [OUT_DIR]

Runs grpcio-tools' protoc with mypy-protobuf's plugins (both must be
installed: the test requirements pin them) and writes, per proto,
<name>_pb2.py, <name>_pb2_grpc.py and their .pyi stubs into OUT_DIR
(default: the package's ``_pb`` folder). The generated modules import each
other as ``charon.v1``; those imports are made relative so that the stubs
live inside ``charon_client`` and claim no top-level package. The test
``tests/test_stubs.py`` runs this into a temporary folder and fails when
the result differs from what is checked in.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTOS = ("charon/v1/limiter.proto", "charon/v1/capacity.proto")
DEFAULT_OUT = HERE / "src" / "charon_client" / "_pb"
FILES = tuple(
    f"{Path(proto).stem}{suffix}"
    for proto in PROTOS
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
)
# `from charon.v1 import limiter_pb2` -> `from . import limiter_pb2`.
ABSOLUTE_IMPORT = re.compile(r"^from charon\.v1 import ", re.MULTILINE)


def generate(out: Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    # The mypy plugins are scripts beside the interpreter (the venv's bin).
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="charon-stubs-") as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            *PROTOS,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {', '.join(PROTOS)} under {PROTO_ROOT}")
        out.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            text = (Path(tmp) / "charon" / "v1" / name).read_text()
            text = ABSOLUTE_IMPORT.sub("from . import ", text)
            (out / name).write_text(text)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    generate(out)
    shutil.rmtree(out / "__pycache__", ignore_errors=True)
    print(f"wrote {', '.join(FILES)} to {out}")


if __name__ == "__main__":
    main()
