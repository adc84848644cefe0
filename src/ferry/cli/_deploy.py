"""``ferry deploy``: put models on the cluster engine a team already runs (Ray Serve, KServe)."""

from __future__ import annotations

import click

from ferry.cli._deploy_kserve import kserve_command
from ferry.cli._deploy_ray import ray_command


@click.group("deploy")
def command() -> None:
    """Deploy models on Ray Serve or KServe, with the server `ferry serve` runs.

    One machine: `ferry serve`. A Ray cluster: `ferry deploy ray`. Kubernetes with KServe:
    `ferry deploy kserve` writes the InferenceService and the predictor's image build.

    \b
    Examples:
      ferry deploy ray models/ --replicas 2
      ferry deploy ray models/ --autoscale 1,4 --address ray://head:10001
      ferry deploy ray --down
      ferry deploy kserve model.onnx -o manifests/
    """


command.add_command(ray_command)
command.add_command(kserve_command)
