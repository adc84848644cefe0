"""``ferry distill``: train a student model towards a teacher on unlabeled samples, judged on
held-back ones, and write it only if it improved."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from ferry.cli._common import console, image_data_options, image_preprocessing, show_report
from ferry.errors import InvalidInputError

#: Exit status when no epoch improved the student (nothing written).
EXIT_UNCHANGED = 3


@click.command("distill")
@click.option(
    "--teacher",
    required=True,
    type=click.Path(path_type=Path),
    help="The reference model (ONNX), run in ONNX Runtime.",
)
@click.option(
    "--student",
    required=True,
    type=click.Path(path_type=Path),
    help="The model to train (same input and output names), e.g. a pruned copy of the teacher.",
)
@click.option(
    "--data",
    required=True,
    type=click.Path(path_type=Path),
    help="Samples: a .npz (one array per input, samples along the first axis), a .npy "
    "(one-input models) or a folder of images (with --image-size). No labels needed; a quarter "
    "is held back for judging.",
)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=None,
    help="Run exactly this many epochs. Default: until the held-back judge has not improved "
    "for --patience epochs, at most 60 and --time-budget.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=16, show_default=True)
@click.option(
    "--lr",
    type=float,
    default=None,
    help="Adam's peak learning rate. Default: a tenth of the rate where the loss was lowest in "
    "a short range test on the student and the data.",
)
@click.option(
    "--patience",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many epochs without a held-back gain (default: 8 without --epochs, "
    "none with it).",
)
@click.option(
    "--schedule",
    type=click.Choice(["cosine", "constant"]),
    default="cosine",
    show_default=True,
    help="cosine: warm-up, then a cosine decay of the rate; constant: the rate throughout.",
)
@click.option(
    "--temperature",
    type=float,
    default=4.0,
    show_default=True,
    help="Softens both models' class distributions in the KL term.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--time-budget",
    "--max-seconds",
    "max_seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds of training: stop before an epoch that would end past it (at least one "
    "runs). Default: 300 without --epochs, none with it.",
)
@click.option(
    "--labels",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A .npy of class labels in the data's order: only reported (held-back accuracy).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Training threads (default: 1 where a training step is short, else torch's count).",
)
@image_data_options
@click.option(
    "--report", type=click.Path(dir_okay=False), help="Write the report as JSON ('-': stdout)."
)
def command(
    teacher: Path,
    student: Path,
    data: Path,
    output: Path,
    epochs: int | None,
    batch_size: int,
    lr: float | None,
    patience: int | None,
    schedule: str,
    temperature: float,
    seed: int,
    max_seconds: float | None,
    labels: Path | None,
    threads: int | None,
    image_size: str | None,
    layout: str,
    mean: str | None,
    std: str | None,
    scale: float,
    report: str | None,
) -> None:
    """Distill TEACHER into STUDENT on --data and write the trained student to OUTPUT.

    The student trains in PyTorch on the KL divergence of the teacher's softened outputs (MSE
    for outputs that are not class scores); after each epoch it is judged against the teacher
    on the held-back quarter of the data and the best epoch is kept. With no options the
    learning rate comes from a short range test, the rate warms up then decays on a cosine, and
    training stops when the held-back judge stops improving (or at 300 s); the report's plan
    line says what was chosen and why, and --epochs/--lr are used as given. Its weights are written
    back into the student's own graph, which is checked in ONNX Runtime against the trained
    module. If no epoch improved the student, nothing is written and the exit status is 3. The
    report is saved beside OUTPUT (OUTPUT.distill.json).

    \b
    Examples:
      ferry distill --teacher model.onnx --student pruned.onnx --data calib.npz -o distilled.onnx
      ferry distill --teacher cls.onnx --student small.onnx --data photos/ --image-size 224x224 \\
          --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225 -o small.distilled.onnx --time-budget 600
    """
    from ferry.optimizer.distill import distill

    if output.exists() and student.exists() and output.resolve() == student.resolve():
        raise InvalidInputError(
            f"refusing to overwrite the student model {student}; choose another -o path"
        )
    preprocessing = image_preprocessing(image_size, layout, mean, std, scale)
    result = distill(
        teacher,
        student,
        data=data,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        patience=patience,
        schedule=schedule,
        temperature=temperature,
        seed=seed,
        max_seconds=max_seconds,
        labels=labels,
        preprocessing=preprocessing,
        threads=threads,
    )
    quiet = show_report(
        result.report,
        report,
        {"teacher": str(teacher), "student": str(student), "output": str(output)},
    )
    if not result.report.improved:
        if not quiet:
            console.print(f"[bold red]not written[/]: {escape(result.report.unchanged or '')}")
        raise SystemExit(EXIT_UNCHANGED)
    written = result.save(output)
    if not quiet:
        console.print(
            f"wrote {escape(str(written))} and its report "
            f"{escape(str(written.with_suffix('.distill.json')))}"
        )
