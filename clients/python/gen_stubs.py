"""Regenerates the checked-in gRPC stubs from proto/charon/v1/limiter.proto.

    python gen_stubs.py [OUT_DIR]

Runs grpcio-tools' protoc with mypy-protobuf's plugins (both must be
installed: the test requirements pin them) and writes limiter_pb2.py,
limiter_pb2_grpc.py and their .pyi stubs into OUT_DIR (default: the
package's ``_pb`` folder). The generated modules import each other as
``charon.v1``; that one import is made relative so that the stubs live
inside ``charon_client`` and claim no top-level package. The test
``tests/test_stubs.py`` runs this into a temporary folder and fails when
the result differs from what is checked in.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO = "charon/v1/limiter.proto"
DEFAULT_OUT = HERE / "src" / "charon_client" / "_pb"
FILES = ("limiter_pb2.py", "limiter_pb2.pyi", "limiter_pb2_grpc.py", "limiter_pb2_grpc.pyi")


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
            PROTO,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {PROTO_ROOT / PROTO}")
        out.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            text = (Path(tmp) / "charon" / "v1" / name).read_text()
            text = text.replace("from charon.v1 import limiter_pb2", "from . import limiter_pb2")
            (out / name).write_text(text)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    generate(out)
    shutil.rmtree(out / "__pycache__", ignore_errors=True)
    print(f"wrote {', '.join(FILES)} to {out}")


if __name__ == "__main__":
    main()
