"""MTCNN's three networks (P-Net, R-Net, O-Net) as PyTorch modules, written from the layer names
of the kit's state_dicts (facenet-pytorch ships weights, and this is the code they need).

The layers: conv + PReLU pairs; max-pools carry no weights (P-Net 2/2 after conv1; R-Net 3/2
after conv1 and conv2; O-Net 3/2, 3/2, 2/2 after conv1..3, all in ceil mode); the dense layers
read the conv features flattened in (W, H, C) order, as the weights were trained.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class PNet(nn.Module):
    """Proposal net: fully convolutional; face probability and box regression per 12x12 window."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.conv3, self.prelu3 = nn.Conv2d(16, 32, 3), nn.PReLU(32)
        self.conv4_1, self.conv4_2 = nn.Conv2d(32, 2, 1), nn.Conv2d(32, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.prelu3(self.conv3(self.prelu2(self.conv2(x))))
        return self.conv4_2(x), torch.softmax(self.conv4_1(x), dim=1)


def _flatten_whc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 2, 1).reshape(x.shape[0], -1)


class RNet(nn.Module):
    """Refinement net on 24x24 crops: face probability and box regression."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 28, 3), nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(28, 48, 3), nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(48, 64, 2), nn.PReLU(64)
        self.dense4, self.prelu4 = nn.Linear(576, 128), nn.PReLU(128)
        self.dense5_1, self.dense5_2 = nn.Linear(128, 2), nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu4(self.dense4(_flatten_whc(self.prelu3(self.conv3(x)))))
        return self.dense5_2(x), torch.softmax(self.dense5_1(x), dim=1)


class ONet(nn.Module):
    """Output net on 48x48 crops: face probability, box regression and five landmarks."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.prelu1 = nn.Conv2d(3, 32, 3), nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2, self.prelu2 = nn.Conv2d(32, 64, 3), nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3, self.prelu3 = nn.Conv2d(64, 64, 3), nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4, self.prelu4 = nn.Conv2d(64, 128, 2), nn.PReLU(128)
        self.dense5, self.prelu5 = nn.Linear(1152, 256), nn.PReLU(256)
        self.dense6_1, self.dense6_2, self.dense6_3 = (
            nn.Linear(256, 2),
            nn.Linear(256, 4),
            nn.Linear(256, 10),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu5(self.dense5(_flatten_whc(self.prelu4(self.conv4(x)))))
        return self.dense6_2(x), self.dense6_3(x), torch.softmax(self.dense6_1(x), dim=1)


class MTCNN(nn.Module):
    """The cascade's three networks side by side, as the kit's entry has them: inputs pnet, rnet,
    onet; outputs pnet.reg, pnet.prob, rnet.reg, rnet.prob, onet.reg, onet.landmarks, onet.prob."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.pnet, self.rnet, self.onet = PNet(), RNet(), ONet()
        for name in ("pnet", "rnet", "onet"):
            state = torch.load(folder / f"{name}.pt", weights_only=True)
            getattr(self, name).load_state_dict(state)
        self.eval()

    def forward(
        self, pnet: torch.Tensor, rnet: torch.Tensor, onet: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return (*self.pnet(pnet), *self.rnet(rnet), *self.onet(onet))
